"""The fleet's story in the log: one line per engine state change, each with its reason.

The fleet calls these as it writes: an engine added (by which source), removed
(why: its source says), moved from one state to another (why: a probe, a
connect failure, its source), ejected as an outlier and back. Nothing is logged
for a write that changes no state, so a steady fleet is quiet. A line is a
WARNING when an engine turns unhealthy, leaves rotation as not ready, or is
removed for what its source calls a failure; INFO otherwise.

Lines are logged as `headcount.fleet`, the component whose state they tell,
with the fields `event`, `engine`, `source`, `url`, `state`, `previous_state`
and `reason` for JSON logs (`logs.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headcount.fleet.engine import Engine, EngineSpec
    from headcount.fleet.outliers import Ejection

__all__ = [
    "added",
    "changed",
    "ejected",
    "ejection_over",
    "panic_over",
    "panic_started",
    "removed",
    "spec_change_reason",
    "state_reason",
]

_log = logging.getLogger("headcount.fleet")

_LISTED = 10
"""Model ids named in the line of an engine that became ready."""


def added(engine: Engine) -> None:
    spec = engine.spec
    _log.info(
        "engine %s added by %s at %s (%s)",
        spec.name,
        spec.source,
        spec.url,
        engine.state,
        extra=_fields("engine_added", engine),
    )


def removed(engine: Engine, reason: str, *, failure: bool = False) -> None:
    """`failure`: the removal takes the engine away for a fault (a WARNING)."""
    _log.log(
        logging.WARNING if failure else logging.INFO,
        "engine %s removed from %s (was %s): %s",
        engine.spec.name,
        engine.spec.source,
        engine.state,
        reason,
        extra=_fields("engine_removed", engine, reason=reason),
    )


def changed(previous: Engine, current: Engine, reason: str) -> None:
    """One line if the engine's state changed, none otherwise."""
    if previous.state is current.state:
        return
    state = current.state
    level = logging.INFO
    if state.value == "unhealthy" or (previous.routable and state.value == "not_ready"):
        level = logging.WARNING
    message = "engine %s %s (was %s): %s"
    args: tuple[object, ...] = (current.spec.name, state, previous.state, reason)
    if current.routable:
        message += "; serves %s"
        args += (_served(current.served),)
    fields = _fields("engine_state", current, reason=reason, previous_state=str(previous.state))
    _log.log(level, message, *args, extra=fields)


def ejected(engine: Engine, ejection: Ejection, now: float, errors: int | None) -> None:
    """`errors`: how many in a row ejected it; None: the last one alone (decisive)."""
    why = "it " if errors is None else f"{errors} errors in a row, the last "
    _log.warning(
        "engine %s ejected for %gs (ejection %d): %s%s",
        engine.spec.name,
        ejection.until - now,
        ejection.count,
        why,
        ejection.reason,
        extra=_fields(
            "engine_ejected",
            engine,
            reason=ejection.reason,
            ejected_seconds=ejection.until - now,
            ejections=ejection.count,
        ),
    )


def ejection_over(engine: Engine) -> None:
    name, fields = engine.spec.name, _fields("engine_ejection_over", engine)
    if engine.routable:
        _log.info("engine %s back in rotation: outlier ejection over", name, extra=fields)
    else:
        _log.info("engine %s: outlier ejection over, still %s", name, engine.state, extra=fields)


def panic_started(model: str, percent: float) -> None:
    _log.warning(
        "model %s: over %g%% of its engines ejected as outliers; routing to all of them",
        model,
        percent,
        extra={"event": "model_panic", "model": model},
    )


def panic_over(model: str) -> None:
    _log.info(
        "model %s: no longer panicking, outliers left out again",
        model,
        extra={"event": "model_panic_over", "model": model},
    )


def state_reason(spec: EngineSpec) -> str:
    """Why an engine that passed its probe is in the state its spec allows."""
    if not spec.ready:
        return f"not ready at {spec.source}"
    if spec.sleeping:
        return "labelled sleeping=true"
    return "probe passed"


def spec_change_reason(previous: EngineSpec, spec: EngineSpec) -> str:
    """What in a spec's change moves its engine to another state (`Fleet` decides which)."""
    if not spec.ready:
        return f"not ready at {spec.source}"
    if spec.url != previous.url:
        return f"address changed to {spec.url}; probing it"
    if not previous.ready:
        return f"ready again at {spec.source}; probing it"
    if spec.sleeping != previous.sleeping:
        return "labelled sleeping=true" if spec.sleeping else "no longer labelled sleeping"
    return "its models or adapters changed; probing it"


def _served(names: Sequence[str]) -> str:
    """Model ids, the first few named."""
    shown = ", ".join(names[:_LISTED])
    return shown if len(names) <= _LISTED else f"{shown} and {len(names) - _LISTED} more"


def _fields(event: str, engine: Engine, **more: Any) -> dict[str, Any]:
    spec = engine.spec
    return {
        "event": event,
        "engine": spec.name,
        "source": spec.source,
        "url": spec.url,
        "state": str(engine.state),
        **more,
    }
