"""The prefix cache's truth under `/sim/`: what it holds and queues, a TTFT prediction, and a reset.

For tests, and for an oracle router that routes on each engine's real cache:

- `GET /sim/kv-cache`: the cache's counters and every cached block (engine
  hash, parent hash, token ids, LoRA, references: those in use first, then
  the free ones in eviction order), the requests running, those waiting for a
  slot or blocks with their prompt tokens and the tokens cached for them now,
  and the seconds of prefill already queued.
- `POST /sim/kv-cache/predict` with a chat or completion body: its prompt
  tokens, the tokens cached for it now, and the time to first token the
  engine's timing model predicts if it arrived now (slot waits are estimated
  from the running requests' due finishing times; block waits are ignored).
- `POST /sim/reset_prefix_cache`: vLLM's reset (an AllBlocksCleared event),
  refused with 409 while requests hold blocks.

The two `kv-cache` routes answer 404 on an engine without a prefix cache.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web

from headcount.sim.engine.parsing import Kind, parse_generation, parse_object
from headcount.sim.engine.run import CachedRun, PrefixCaching, Run
from headcount.sim.engine.state import EngineState
from headcount.sim.engine.wire import JSON, RequestError, json_bytes

__all__ = ["KvAdmin"]

_NO_CACHE = RequestError(404, "this engine has no prefix cache (--kv-blocks)", "NotFoundError")


class KvAdmin:
    """The prefix-cache handlers under `/sim/`."""

    def __init__(self, state: EngineState) -> None:
        self._state = state

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/sim/kv-cache", self._view),
            web.post("/sim/kv-cache/predict", self._predict),
            web.post("/sim/reset_prefix_cache", self._reset),
        ]

    async def _view(self, request: web.Request) -> web.Response:
        caching = self._state.caching
        if caching is None:
            return _NO_CACHE.response()
        scheduler = self._state.scheduler
        view = caching.kv.view()
        view["running"] = len(scheduler.running)
        view["waiting"] = [
            {"prompt_tokens": run.generation.prompt_tokens, "cached_tokens": _hit(caching, run)}
            for run in _cached(scheduler.waiting)
        ]
        view["prefill_backlog_s"] = caching.pipeline.backlog()
        return web.Response(body=json_bytes(view), content_type=JSON)

    async def _predict(self, request: web.Request) -> web.Response:
        state, caching = self._state, self._state.caching
        if caching is None:
            return _NO_CACHE.response()
        try:
            raw = await request.read()
            kind: Kind = "chat" if "messages" in parse_object(raw) else "completion"
            served = state.models.served
            generation = parse_generation(raw, kind, state.config.model, served, state.tokenizer)
            run = state.run(generation)
        except RequestError as error:
            return error.response()
        assert isinstance(run, CachedRun)
        cached = _hit(caching, run)
        answer = {
            "prompt_tokens": generation.prompt_tokens,
            "cached_tokens": cached,
            "ttft_s": self._ttft(caching, generation.prompt_tokens - cached),
        }
        return web.Response(body=json_bytes(answer), content_type=JSON)

    def _ttft(self, caching: PrefixCaching, uncached: int) -> float:
        scheduler, pipeline = self._state.scheduler, caching.pipeline
        waiting = _cached(scheduler.waiting)
        queued = sum(run.generation.prompt_tokens - _hit(caching, run) for run in waiting)
        start = pipeline.backlog() + queued / pipeline.tokens_per_s
        limit, running = scheduler.max_running, scheduler.running
        if limit is not None and running and len(running) + len(waiting) >= limit:
            due = sorted(run.finishes_at for run in running)
            ahead = min(len(running) + len(waiting) - limit, len(due) - 1)
            start = max(start, due[ahead] - caching.timebase.now())
        return start + uncached / pipeline.tokens_per_s + caching.token_delay

    async def _reset(self, request: web.Request) -> web.Response:
        reset = self._state.reset_prefix_cache(announce=True)
        return web.Response(
            status=200 if reset else 409, body=json_bytes({"reset": reset}), content_type=JSON
        )


def _cached(runs: Iterable[Run]) -> list[CachedRun]:
    return [run for run in runs if isinstance(run, CachedRun)]


def _hit(caching: PrefixCaching, run: CachedRun) -> int:
    return len(caching.kv.hit(run.sequence)) * caching.kv.block_size
