"""``python -m headcount.sim.engine``: the engine as a program, as benchmarks run it."""

from headcount.sim.engine.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main()
