"""`python3 -m numbakv.replay`: the command of numbakv.tools.replay.command."""

from numbakv.tools.replay.command import main

if __name__ == "__main__":
    raise SystemExit(main())
