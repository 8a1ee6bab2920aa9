"""`python3 -m numbakv.workloads`: the command of numbakv.tools.workloads."""

from numbakv.tools.workloads import main

if __name__ == "__main__":
    raise SystemExit(main())
