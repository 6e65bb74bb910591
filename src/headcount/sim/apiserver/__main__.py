"""``python -m headcount.sim.apiserver``: the emulator as a program, for other processes."""

from headcount.sim.apiserver.cli import main

__all__: list[str] = []

if __name__ == "__main__":
    main()
