"""`python3 -m numbakv.workloads`: the command of numbakv.tools.workloads.command."""

from numbakv.tools.workloads.command import main

if __name__ == "__main__":
    raise SystemExit(main())
