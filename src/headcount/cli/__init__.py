"""The `headcount` command line: `serve`, `demo`, and the two simulators.

`main.py` dispatches the subcommands, `serve_flags.py` turns flags into the
settings tree, `serve_hints.py` says once at start what `serve` accepts but
probably does not mean, `demo.py` is `make demo`.
"""

from headcount.cli.main import main

__all__ = ["main"]
