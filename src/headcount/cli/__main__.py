"""``python -m headcount.cli``: the `headcount` command, as tests and the demo run it."""

import sys

from headcount.cli.main import main

__all__: list[str] = []

if __name__ == "__main__":
    sys.exit(main())
