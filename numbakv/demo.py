"""`python3 -m numbakv.demo`: the command of numbakv.tools.demo."""

from numbakv.tools.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
