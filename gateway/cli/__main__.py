"""`python -m gateway.cli ...`: the `gateway` command (the supervisor of `--workers N` starts its
workers this way)."""

import sys

from gateway.cli import main

sys.exit(main())
