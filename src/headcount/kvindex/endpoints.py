"""Where each engine publishes its KV events, and which engines cannot be told apart (pure).

An engine's endpoints are its host with its annotated ports, else the router's
defaults. Two engines that resolve to one endpoint (two engines on one host on
the default ports; static backends have no annotations) would read one stream,
each predicted to hold the other's blocks, and a batch does not say which
engine sent it: such engines get no stream, and the reason says which other
engine shares it and what to set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from headcount.fleet import EngineSpec
from headcount.kvindex.stream import SubscriberTarget

__all__ = ["Endpoints", "SharedEndpoints", "shared_endpoints"]


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The router's defaults for engines that do not say where they publish."""

    port: int
    replay_port: int
    topic: str
    replay_timeout: float

    def target(self, spec: EngineSpec) -> SubscriberTarget | None:
        """Where `spec`'s engine publishes; None without a host."""
        host = urlsplit(spec.url).hostname
        if not host:
            return None
        host = f"[{host}]" if ":" in host else host
        port = spec.kv_events_port or self.port
        replay = spec.kv_events_replay_port or self.replay_port
        return SubscriberTarget(
            endpoint=f"tcp://{host}:{port}",
            replay_endpoint=f"tcp://{host}:{replay}",
            topic=self.topic,
            replay_timeout=self.replay_timeout,
        )


@dataclass(frozen=True, slots=True)
class SharedEndpoints:
    why: Mapping[str, str]
    """Per engine id whose endpoint is another's too, why it gets no stream."""
    groups: frozenset[tuple[str, tuple[str, ...]]]
    """Each shared endpoint with the names of the engines that share it."""


def shared_endpoints(
    names: Mapping[str, str], targets: Mapping[str, SubscriberTarget | None]
) -> SharedEndpoints:
    """The engines (by id, `names` their names) whose publisher or replay endpoint is another
    engine's too."""
    users: dict[tuple[str, str], list[str]] = {}
    for engine_id, target in targets.items():
        if target is not None:
            users.setdefault((target.endpoint, "kv-events-port"), []).append(engine_id)
            users.setdefault((target.replay_endpoint, "kv-events-replay-port"), []).append(
                engine_id
            )
    why: dict[str, str] = {}
    groups: set[tuple[str, tuple[str, ...]]] = set()
    for (endpoint, annotation), ids in users.items():
        if len(ids) < 2:
            continue
        sharing = tuple(sorted(names[i] for i in ids))
        groups.add((endpoint, sharing))
        for engine_id in ids:
            others = ", ".join(n for n in sharing if n != names[engine_id])
            why.setdefault(
                engine_id,
                f"{endpoint} is also {others}'s KV-event endpoint: events not attributed; "
                f"give each engine its own {annotation} annotation",
            )
    return SharedEndpoints(why, frozenset(groups))
