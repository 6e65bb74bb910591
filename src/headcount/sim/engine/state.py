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
from headcount.sim.engine.kv_cache import KvCache
from headcount.sim.engine.kv_sink import KvEventSink, NullKvEventSink
from headcount.sim.engine.models import ModelCatalog
from headcount.sim.engine.parsing import Generation
from headcount.sim.engine.prefill import PrefillPipeline
from headcount.sim.engine.run import CachedRun, PrefixCaching, Run
from headcount.sim.engine.scheduler import Scheduler
from headcount.sim.engine.timebase import REAL_TIME, Timebase
from headcount.sim.engine.tokens import output_ids
from headcount.sim.engine.wire import bad_request
from headcount.tokens import ChatTokenizer, builtin_tokenizer

__all__ = ["EngineState"]


class EngineState:
    """The engine's name, models, failure mode, tokenizer, scheduler, cache and request counts."""

    def __init__(self, config: EngineSimConfig, timebase: Timebase = REAL_TIME) -> None:
        self.config = config
        self.name = config.name or ""
        """`config.name`, or `host:port` once listening."""
        self.timebase = timebase
        self.failures = FailureGate(config.fail_mode, config.die_after_chunks)
        self.scheduler: Scheduler[Run] = Scheduler(config.max_running)
        self.models = ModelCatalog(config.model, config.max_model_len, list(config.adapters))
        self.tokenizer: ChatTokenizer = builtin_tokenizer()
        """The built-in tokenizer, or `config.tokenizer`'s once the server has loaded it."""
        self.caching: PrefixCaching | None = None
        if config.kv_blocks is not None:
            kv = KvCache(config.kv_blocks, config.block_size, NullKvEventSink())
            pipeline = PrefillPipeline(config.prefill_tokens_per_s, timebase.now)
            self.caching = PrefixCaching(kv, pipeline, timebase, config.token_delay, self.scheduler)
        self.served = 0
        self.prompt_tokens = 0
        """Prompt tokens prefilled, ever: vLLM's `prompt_tokens_total`, counted as prefills end."""
        self.generation_tokens = 0
        """Tokens generated, ever: vLLM's `generation_tokens_total`, counted as they are
        generated, whether or not the answer is streamed; none while stalled."""
        self.in_flight = 0
        self.idle = asyncio.Event()
        self.idle.set()
        self.disconnects = 0
        self.unauthorized = 0
        """`/v1/` requests refused for a missing or wrong key (`api_key`)."""
        self.stopping = False

    def run(self, generation: Generation) -> Run:
        """`generation` as the scheduler will run it; a 400 if it could never fit the cache."""
        caching = self.caching
        if caching is None:
            return Run(generation)
        lora = generation.model if generation.model != self.config.model else None
        outputs = output_ids(self.tokenizer, generation.context, generation.max_tokens)
        seq = caching.kv.sequence(generation.prompt_ids, outputs, lora)
        if not caching.kv.fits_ever(seq):
            raise bad_request("the prompt and max_tokens need more KV blocks than the engine has")
        return CachedRun(generation, caching, seq)

    def set_kv_sink(self, sink: KvEventSink) -> None:
        """Send the prefix cache's events (if it has one) to `sink` from now on."""
        if self.caching is not None:
            self.caching.kv.pool.sink = sink

    def reset_prefix_cache(self, announce: bool) -> bool:
        """Forget every cached block. `announce`: vLLM's reset, with an AllBlocksCleared
        event, refused (False) while a request holds blocks. Otherwise silently and
        always, as an engine restart loses its cache."""
        return self.caching is None or self.caching.kv.clear(announce)

    def load(self) -> tuple[int, int]:
        """(running, waiting) as vLLM reports them, now: admitted requests whose prefill has
        not begun count as waiting (vLLM has not scheduled them), preempted ones too."""
        scheduler, now = self.scheduler, self.timebase.now()
        queued = sum(1 for run in scheduler.running if run.prefill_starts_at > now)
        return len(scheduler.running) - queued, len(scheduler.waiting) + queued

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
            "after_chunks": self.failures.after_chunks,
            "served": self.served,
            "in_flight": self.in_flight,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "preemptions": self.scheduler.preemptions,
            "disconnects": self.disconnects,
            "unauthorized": self.unauthorized,
        }
