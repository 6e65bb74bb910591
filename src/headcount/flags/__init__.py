"""What every command line shares: one-line errors with suggestions, and values as people type them.

`headcount serve` (`cli/`) and the simulators (`sim/`) parse their flags with
these, so they sit below both: `parser.py` (the parser and its one-line
errors), `values.py` (durations, sizes, ports and their defaults in help).
"""

__all__: list[str] = []
