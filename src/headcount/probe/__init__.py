"""Probing engines: what each serves (`/v1/models`) and how busy it is (`/metrics`).

`prober.py` runs the probes, `model_list.py` reads `/v1/models` as it streams
in, `resolver.py` looks engine names up as the proxy does.
"""

from headcount.probe.prober import Prober

__all__ = ["Prober"]
