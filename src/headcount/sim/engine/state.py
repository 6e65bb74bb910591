"""One engine's state apart from its sockets: who it is, what it serves, what it is doing.

The OpenAI, probe and admin endpoints each read and update it; the server
(`SimEngine`) owns it with the sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from headcount.sim.engine.config import EngineSimConfig
from headcount.sim.engine.failures import FailureGate
from headcount.sim.engine.models import ModelCatalog
from headcount.sim.engine.scheduler import Scheduler

__all__ = ["EngineState"]


class EngineState:
    """The engine's name, models, failure mode, scheduler and request counts."""

    def __init__(self, config: EngineSimConfig) -> None:
        self.config = config
        self.name = config.name or ""
        """`config.name`, or `host:port` once listening."""
        self.failures = FailureGate(config.fail_mode)
        self.scheduler = Scheduler(config.max_running)
        self.models = ModelCatalog(config.model, config.max_model_len, list(config.adapters))
        self.served = 0
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.disconnects = 0
        self.unauthorized = 0
        """`/v1/` requests refused for a missing or wrong key (`api_key`)."""
        self.stopping = False

    @contextlib.contextmanager
    def in_flight_request(self) -> Iterator[None]:
        """Count a generation or embedding request in flight (`drain` waits for none); a
        cancellation inside is its client gone."""
        self.in_flight += 1
        self.idle.clear()
        try:
            yield
        except asyncio.CancelledError:
            self.note_disconnect()
            raise
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self.idle.set()

    def note_disconnect(self) -> None:
        """Count a client gone mid-request, unless the engine itself dropped it."""
        if not self.stopping and self.failures.mode != "refuse":
            self.disconnects += 1

    def stats(self) -> dict[str, object]:
        """What the engine has done and is doing, for tests: the body of `/sim/stats`."""
        return {
            "name": self.name,
            "fail_mode": self.failures.mode,
            "served": self.served,
            "in_flight": self.in_flight,
            "running": self.scheduler.running,
            "waiting": self.scheduler.waiting,
            "disconnects": self.disconnects,
            "unauthorized": self.unauthorized,
        }
