"""Simulators that stand in for what these machines cannot run: inference engines, Kubernetes."""

__all__: list[str] = []
