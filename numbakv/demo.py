"""`python3 -m numbakv.demo`: the command of numbakv.tools.demo.command."""

from numbakv.tools.demo.command import main

if __name__ == "__main__":
    raise SystemExit(main())
