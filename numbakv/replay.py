"""`python3 -m numbakv.replay`: the command of numbakv.tools.replay_command."""

from numbakv.tools.replay_command import main

if __name__ == "__main__":
    raise SystemExit(main())
