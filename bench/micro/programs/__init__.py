"""The micro-benchmarks' programs, each run as a process of its own (`python -m`)."""
