"""`python -m warmfleet_cli ...`: the `warmfleet` command without its script."""

import sys

from warmfleet_cli.main import main

sys.exit(main())
