"""The hostile suite's programs, each run as a process of its own (`python -m`)."""
