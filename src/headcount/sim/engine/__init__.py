"""A vLLM-like inference engine on loopback, so tests, the demo and benchmarks need no GPU.

It speaks the part of the OpenAI API that vLLM serves (`/v1/models` with LoRA
adapters, chat and text completions, streamed or not, embeddings), exposes
vLLM's Prometheus metrics computed from its real state, and fails on demand::

    async with running_engine(EngineSimConfig(adapters=("sql-lora",), max_running=2)) as engine:
        ...  # talk to engine.url
        await engine.set_fail_mode("refuse")  # connects now get ECONNREFUSED
        await engine.set_fail_mode("none")  # listening again, on the same port
        await engine.set_fail_mode("die-mid-stream", after_chunks=5)  # RST after 5 chunks

Scheduling: at most `max_running` requests generate at once (unlimited by
default); the others wait in FIFO order, counted as waiting. Each token takes
`token_delay` seconds. A client that disconnects, waiting or running, stops
its generation and frees its place.
Prompts become the token ids vLLM would compute (`headcount.tokens`; a model's
tokenizer directory with `tokenizer`). With `kv_blocks` the engine keeps a
prefix cache as vLLM's (`kv_cache`, `block_pool`) and prefills uncached prompt
tokens at `prefill_tokens_per_s` (`prefill`), gives tokens blocks as they
need them and preempts when none is free (`scheduler`, `run`), reports hits
in usage and metrics, shows its blocks under `/sim/kv-cache`, and sends block events to a
`KvEventSink`. It also serves `/tokenize`, vLLM's render routes and the info
routes peer routers read (`tokenize_api`).

An answer continues its request's text: each token is a hash of the three
before it (`tokens`), so a request resumed after k tokens of an answer (an
assistant message holding them with `continue_final_message`, or the prompt
followed by them) goes on, on any engine, with exactly the rest of it;
`answer_text(body, "chat" | "completion", tokens)` computes an answer's start
from a request body, as a router's test or a benchmark expects it.

Failure modes (`FailMode`), switchable at runtime, also over `POST /sim/fail-mode`
(`{"mode": "die-mid-stream", "after_chunks": 5}`; `after_chunks` only with the
three mid-stream modes, `config.die_after_chunks` when left out):

- `none`: healthy.
- `refuse`: the listening socket and every open connection are closed, so
  connects get ECONNREFUSED; any other mode listens again on the same port.
- `hang`: every non-admin endpoint (including `/health` and `/metrics`) and
  every running stream stops answering until the mode changes.
- `stall`: completions and embeddings stop (new ones never answer, running
  streams send nothing more) while `/health`, `/metrics` and `/v1/models` still
  answer: a wedged engine loop behind a live HTTP server, which probes cannot see.
- `die-mid-stream`: streams send `die_after_chunks` chunks (default 2; the
  usage chunk and `[DONE]` count as one more), then the connection is reset
  (SO_LINGER 0: the client reads ECONNRESET, not an end of file) without the
  terminating chunk; non-streaming generation and embedding requests get the
  connection reset without a response.
- `truncate-mid-stream`: after those chunks, the first half of the next one
  (an SSE event cut inside its JSON), then the connection closes (FIN) without
  HTTP's terminating zero-length chunk; a whole answer is its first half under
  a `Content-Length` promising all of it, then the same close.
- `stall-mid-stream`: after those chunks, a stream sends nothing more, its
  connection open, until the mode changes; back to `none` it goes on where it
  stopped (to another mid-stream mode: it breaks that way). `/health`,
  `/metrics`, `/v1/models`, whole answers and new requests answer as usual
  (a new stream stalls in its turn after its chunks), unlike `stall`.
  A stream shorter than `die_after_chunks` chunks ends normally in all three.
- `http-500`: every `/v1/` endpoint answers 500 with an OpenAI-shaped error;
  `/health` and `/metrics` still answer, like an engine whose model is broken.

With `api_key` (vLLM's `--api-key`) every `/v1/` request needs
`Authorization: Bearer <key>` and gets 401 without it; `/health`, `/metrics`
and `/sim/` stay open.

The admin API under `/sim/` (`fail-mode`, `adapters`, `stats`, `kv-cache`,
`reset_prefix_cache`) ignores every failure mode but `refuse`, which can only
be undone in-process. Every response
carries `x-engine-name` and echoes `x-request-id`; JSON completions also name
the engine in `system_fingerprint`.

With `kv_events` (`--kv-events-port`) it publishes its prefix cache's changes
as vLLM's KV events over ZMQ, with a replay socket and faults under
`/sim/kv-events` (`kv_publisher`, `kv_events_api`).

Run alone with `python -m headcount.sim.engine --port 8100 --adapters a,b`.
"""

from headcount.sim.engine.cli import (
    add_arguments,
    config_from_args,
    serve_forever,
    serve_until_signalled,
)
from headcount.sim.engine.config import FAIL_MODES, EngineSimConfig, FailMode
from headcount.sim.engine.server import SimEngine, running_engine, start_engine
from headcount.sim.engine.timebase import Timebase
from headcount.sim.engine.tokens import answer_text

__all__ = [
    "FAIL_MODES",
    "EngineSimConfig",
    "FailMode",
    "SimEngine",
    "Timebase",
    "add_arguments",
    "answer_text",
    "config_from_args",
    "running_engine",
    "serve_forever",
    "serve_until_signalled",
    "start_engine",
]
