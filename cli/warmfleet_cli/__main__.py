"""`python -m warmfleet_cli ...`: the `warmfleet` command without its script."""

import sys

from warmfleet_cli.main import main

if __name__ == "__main__":  # not again in the router's spawned worker processes
    sys.exit(main())
