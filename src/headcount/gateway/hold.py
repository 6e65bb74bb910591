"""An engine's hold on a request picked for a gateway: from the pick to the request's end.

The counts are those `proxy/exchange.py` keeps for an attempt of its own:
`in_flight` (and `requests`) from the pick to the end, `awaiting` and kv-aware's
`prefill_queued` until the response's headers. When the gateway retried on a
fallback, the hold moves to the endpoint that served (and flow control's
ticket with it). At the end the answer feeds outlier detection by the
exchange's rules: a 5xx counts against the engine (a 504, the gateway's
timeout, as a gateway error), an answer under 500 that came whole resets its
count; a request whose client left says nothing of the engine.
"""

from __future__ import annotations

from headcount.fleet import Engine, Fleet
from headcount.fleet.outliers import GATEWAY_ERROR, HTTP_5XX
from headcount.proxy.admission import Admitted
from headcount.surfaces.metrics import Metrics

__all__ = ["Hold"]


class Hold:
    """The engine holding one request; every count given back once."""

    __slots__ = ("_admitted", "_awaiting", "_prefill", "engine")

    def __init__(self, admitted: Admitted) -> None:
        self._admitted = admitted
        engine = self.engine = admitted.engine
        load = engine.load
        load.in_flight += 1
        load.awaiting += 1
        load.requests += 1
        self._awaiting = True
        kv = admitted.features.kv
        self._prefill = 0 if kv is None else kv.dispatch(engine)

    def answered(self, fleet: Fleet, served: str | None, status: int) -> Engine:
        """The response's headers came from `served` (None: not said): the engine answering."""
        engine = self.engine
        if served is not None and served != engine.spec.endpoint():
            engine = self._move(fleet, served)
        self._unwait()
        kv = self._admitted.features.kv
        if 200 <= status < 300 and kv is not None:
            kv.prefilled(engine)
        return engine

    def _move(self, fleet: Fleet, served: str) -> Engine:
        """The hold moves to `served` (stays when the fleet does not know it)."""
        admitted, engine = self._admitted, self.engine
        for other in fleet.snapshot.candidates(admitted.features.model):
            if other.spec.endpoint() == served:
                self._unwait()
                engine.load.in_flight -= 1
                other.load.in_flight += 1
                other.load.requests += 1
                self.engine = other
                if admitted.ticket is not None:
                    admitted.ticket.moved(other)
                return other
        return engine

    def _unwait(self) -> None:
        if not self._awaiting:
            return
        self._awaiting = False
        load = self.engine.load
        load.awaiting -= 1
        load.answered += 1
        if self._prefill:
            load.prefill_queued -= self._prefill
            self._prefill = 0

    def release(self, fleet: Fleet, metrics: Metrics, status: int, judged: bool) -> None:
        """The request's end (call once): the counts given back; `judged`, the answer with
        `status` counts for or against the engine."""
        self._unwait()
        engine = self.engine
        load = engine.load
        load.in_flight -= 1
        if not judged:
            return
        if status >= 500:
            load.failures += 1
            reason = GATEWAY_ERROR if status == 504 else HTTP_5XX
            if fleet.record_error(engine.id, reason):
                metrics.outlier_ejected(reason)
        else:
            load.consecutive_errors = 0
