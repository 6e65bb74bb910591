"""The values the fleet is made of: what an engine is, how loaded it is, where it stands.

They sit below everything that reads or writes the fleet (discovery maps
Kubernetes objects to `EngineSpec`, the prober reports a `ProbeResult`,
policies read `Engine` and `EngineLoad`), so none of those imports the `Fleet`
that owns them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from headcount.fleet.capacity import Capacity
from headcount.fleet.outliers import NOT_EJECTED, Ejection
from headcount.fleet.vllm_load import VllmLoad

__all__ = ["Engine", "EngineLoad", "EngineSpec", "EngineState", "ProbeResult"]


class EngineState(enum.StrEnum):
    """Where an engine stands; only READY engines are routed to."""

    PENDING = "pending"
    """Discovered, not probed yet: its served models are unknown."""
    READY = "ready"
    UNHEALTHY = "unhealthy"
    """Probes fail, or the proxy could not connect to it (ejected until a probe succeeds)."""
    SLEEPING = "sleeping"
    """Labelled `sleeping=true`: known, probed, never routed."""
    NOT_READY = "not_ready"
    """Its source says it is not ready (a Service with no ready endpoint)."""


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """What discovery knows about an engine: identity, address and the metadata it reads."""

    id: str
    """Stable identity: the pod or Service UID, or the URL for a static engine."""
    name: str
    """Human-readable name (pod name, Service name, URL); the `engine` metric label."""
    url: str
    source: str
    """Which discovery source owns it; `reconcile` replaces one source's engines."""
    model_label: str | None = None
    sleeping: bool = False
    ready: bool = True
    lora_revision: str | None = None
    """The `lora-modified` annotation: a new value means adapters changed."""
    object_ref: str | None = None
    resource_version: str | None = None
    kv_events_port: int | None = None
    """Where its KV-event publisher listens (a pod annotation), None: the router's default."""
    kv_events_replay_port: int | None = None

    def endpoint(self) -> str:
        """`host:port`, as a gateway names an endpoint (the port implied by the scheme when
        the URL gives none)."""
        parts = urlsplit(self.url)
        if parts.port is not None:
            return parts.netloc.rpartition("@")[2]
        return f"{parts.netloc.rpartition('@')[2]}:{443 if parts.scheme == 'https' else 80}"

    def probe_key(self) -> tuple[object, ...]:
        """The fields whose change requires a re-probe; other changes are bookkeeping."""
        return (self.url, self.ready, self.model_label, self.sleeping, self.lora_revision)


@dataclass(slots=True)
class EngineLoad:
    """What changes per request or per probe, mutated in place so no snapshot is rebuilt.

    The proxy holds `in_flight` (released in `finally`, never reset) and `awaiting`,
    counts `requests`, `answered` and `failures`; the prober writes the scraped gauges. One object
    lives as long as its engine, shared by every snapshot that holds the engine.
    """

    in_flight: int = 0
    granted: int = 0
    """Requests flow control granted here and not ended (with a tenants file): the engine
    has room while they are fewer than its learned `concurrency`."""
    awaiting: int = 0
    """Of `in_flight`, the attempts with no response byte yet: queued or prefilling there."""
    requests: int = 0
    answered: int = 0
    """Attempts that got a response head: an engine whose count stands still while requests
    wait on it has stopped answering (`proxy/stalls.py`)."""
    failures: int = 0
    consecutive_errors: int = 0
    """Errors in a row as outlier detection counts them (`outliers.py`); any answer under 500
    resets it."""
    running: float = 0.0
    """Scraped `vllm:num_requests_running`: every router's traffic, not only ours."""
    waiting: float = 0.0
    kv_usage: float | None = None
    prefill_queued: int = 0
    """Prompt tokens this router sent that the engine has not answered yet (no first byte),
    less those predicted cached: the prefill work queued on it by us."""
    prefix_cache_queries: float | None = None
    """Scraped `vllm:prefix_cache_queries_total` (tokens), None until scraped."""
    prefix_cache_hits: float | None = None
    """Scraped `vllm:prefix_cache_hits_total` (tokens)."""
    kv_capacity_blocks: int | None = None
    """`num_gpu_blocks` of the scraped `vllm:cache_config_info`."""
    kv_block_size: int | None = None
    """`block_size` of the scraped `vllm:cache_config_info`."""
    progress: float | None = None
    """Scraped prompt plus generated tokens processed, ever (vLLM's token counters), None when
    the engine exports neither: they move while it works, even with no answer to send yet."""
    concurrency: Capacity = field(default_factory=Capacity)
    """Requests the engine runs at once, as learned from its gauges (`capacity.py`)."""
    scrapes: int = 0
    """Probes recorded, each setting the scraped figures: tells a fresh `progress` from one
    already seen."""


@dataclass(frozen=True, slots=True)
class ProbeResult:
    """One probe of an engine: its `/v1/models` entries and scraped load, or why it failed."""

    ok: bool
    cards: tuple[Mapping[str, Any], ...] = ()
    load: VllmLoad = field(default_factory=VllmLoad)
    """What its `/metrics` said (all unknown when it had none)."""
    error: str | None = None
    inconclusive: bool = False
    """The probe failed for the router's own reasons (a failed DNS lookup, no free fd): the
    error is recorded, the engine's state is left as it was."""


@dataclass(frozen=True, slots=True)
class Engine:
    """An engine as readers see it in one snapshot."""

    spec: EngineSpec
    load: EngineLoad
    state: EngineState = EngineState.PENDING
    cards: tuple[Mapping[str, Any], ...] = ()
    probe_failures: int = 0
    last_error: str | None = None
    ejection: Ejection = NOT_EJECTED
    """Outlier ejections: out of rotation while active (`Snapshot.ejected`)."""

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def served(self) -> tuple[str, ...]:
        """Model ids this engine answers to: base models and LoRA adapters."""
        return tuple(str(card["id"]) for card in self.cards)

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(str(card["id"]) for card in self.cards if not card.get("parent"))

    @property
    def adapters(self) -> tuple[str, ...]:
        return tuple(str(card["id"]) for card in self.cards if card.get("parent"))

    @property
    def routable(self) -> bool:
        return self.state is EngineState.READY
