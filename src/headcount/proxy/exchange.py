"""One proxied request from routing to its single end: attempts, failover, streaming back.

Failure before the first response byte is retried on a different engine, at
most `max_failovers` times: a connect failure (which also ejects the engine
until a probe revives it), a connection closed before any byte, a 502/503
from the engine, a failed DNS lookup, no byte within `first_byte_timeout`
(when set), or the engine leaving rotation or the fleet while the attempt
waits (`engine_left`: a request never waits on an engine known to be dead).
Another 5xx answer (500, 504, ...) is tried once more, on another engine, to
tell whose fault it is (below). A stale pooled connection is retried once on
a fresh connection to the same engine, not counted as a failover. After the
first byte a request is not retried whole; a streamed chat or text completion
that breaks (the connection reset or closed, a malformed chunk, no byte within
`--read-timeout`, its engine leaving the fleet or rotation) is resumed on
another engine from the text already relayed, at most `resume_limit` times
(`resume.py` says how and when it is refused; the `Transcript` keeps what
was relayed, whole events only). A stream that is not resumed closes the
client connection, its chunked body left unterminated (after an error event,
when the stream was followed). The router's own exhaustion (no fd for a
connection) is answered 503 at once and counted against no engine. A request
only one engine can answer (`PinnedFeatures`: a Responses API
follow-up) is neither failed over nor resumed: any other engine would say 404.
A Responses create's answer is read for its id (`stored_responses.IdTap`).

Every attempt holds `engine.load.in_flight` from routing to its end, released
at a single point (`Exchange._release`), and sits in its engine's entry of
`ExchangeContext.waiting` until its first response byte, so the proxy finds
the exchanges an engine's departure concerns without scanning the others,
and the stall watch (`stalls.py`) finds the ones an engine that stopped
answering keeps waiting; `engine.load.awaiting` counts them for the policy.
Each answer feeds outlier detection (`fleet/outliers.py` has the rule): a
gateway error (a broken stream included) or a 502/503 counts against the
engine (`Fleet.record_error`), any other answer under 500, once whole, resets
its count. Another 5xx is a suspicion the request resolves: when the next
engine answers under 500, the suspect's 5xx counts against it; when that
engine answers a 5xx too, the request is at fault and neither is counted (the
client gets the second answer); with no other engine to try, or none
answering, it counts once at the request's end.

A `kv-aware` routed request (`RequestFeatures.kv`) also holds, per attempt,
the prompt tokens its engine must prefill in `engine.load.prefill_queued`,
given back at the same points as the waiting entry (first byte, or the
attempt's end by any path); the index hears `routed` at dispatch and
`prefilled` at a 2xx first byte; the response carries the route receipt
(`routing.kv.request`) of the engine that answered.

Every request ends once, in `_end`: the metrics hear the status the client saw
and how the answer ended (a stream that breaks after its 200 is `200`, outcome
`cut`; one whole after a resume, `resumed`), and the access log
(`access_log.py`) decides whether it gets a line.

An exchange sees the proxy only through `ExchangeContext`: exactly what it uses.
(Over 450 lines: one request's single end, every path through `_release`, resumes
included, is easier to check in one file than split.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from headcount._http.errors import (
    Abandoned,
    ConnectFailed,
    FirstByteTimeout,
    LocalResourceExhausted,
    LookupFailed,
    NoResponse,
    StaleConnection,
    UpstreamError,
    UpstreamTimeout,
)
from headcount._http.handler import Responder
from headcount._http.pool import UpstreamPool, Upstreams
from headcount._http.upstream import ResponseHead, ResponseListener, UpstreamConnection
from headcount._http.wire import JSON_HEADER
from headcount.fleet import Engine, EngineLoad, Fleet, Snapshot
from headcount.fleet.outliers import GATEWAY_ERROR, HTTP_5XX
from headcount.flow.ticket import Ticket
from headcount.proxy.errors import (
    INTERNAL_ERROR,
    ErrorAnswer,
    overloaded,
    unroutable,
    upstream_failed,
    upstream_timed_out,
)
from headcount.proxy.headers import find_header, is_event_stream, response_headers
from headcount.proxy.rejections import tenant_name
from headcount.proxy.resume import LIMIT, NO_ENGINE, UNREADABLE, Kind, Seam, continuation
from headcount.proxy.stalls import StallWatch
from headcount.proxy.stored_responses import IdTap, StoredResponses
from headcount.proxy.transcript import Transcript
from headcount.proxy.usage import UsageTap, usage_of
from headcount.routing import PinnedFeatures, Policy, RequestFeatures
from headcount.surfaces.access_log import AccessEntry, AccessLog
from headcount.surfaces.metrics import (
    CLIENT_CLOSED,
    CUT,
    RESUME_FAILED,
    RESUMED,
    RETRIED,
    Metrics,
    whole,
)

__all__ = ["CLIENT_CLOSED_STATUS", "Exchange", "ExchangeContext"]

_log = logging.getLogger(__name__)

_FAILOVER_STATUSES = frozenset({502, 503})
_FAILOVER_REASONS = {status: f"http_{status}" for status in _FAILOVER_STATUSES}
CLIENT_CLOSED_STATUS = 499
"""Recorded when the client leaves before any status was sent (nginx's convention)."""
_FAILOVER_ERRORS = (ConnectFailed, NoResponse, FirstByteTimeout, Abandoned, LookupFailed)
_SUSPECT_5XX = "http_5xx"
"""The failover reason of a 5xx other than 502/503: tried once more to tell whose it is."""
_BLAMELESS = (Abandoned, LookupFailed)
"""Failures that say nothing against the engine: not counted, never eject."""
_RESOURCE_NAMES = {"fds": "file descriptors"}
_KINDS: dict[bytes, Kind] = {b"/v1/chat/completions": "chat", b"/v1/completions": "completion"}
"""The answers a broken stream of which is resumed."""
_RESUMABLE_BODY_MAX = 1024 * 1024
"""A larger body is not read again on the loop to resume its stream (`large_body`)."""
_LENGTH = b"content-length: "
_WHOLE_MAX = 1024 * 1024
"""Bytes of an unstreamed answer held until it is whole (asked again if it breaks); a larger
one is relayed as it comes."""


@dataclass(frozen=True, slots=True)
class ExchangeContext:
    """What an exchange uses of the proxy, and nothing more."""

    fleet: Fleet
    """Candidates for failover (from the current snapshot) and ejection on connect failure."""
    policy: Policy
    upstreams: Upstreams
    metrics: Metrics
    max_failovers: int
    spawn: Callable[[Awaitable[None]], asyncio.Task[None]]
    """Runs a connect attempt as a task the proxy cancels on close."""
    waiting: dict[str, dict[Exchange, None]]
    """Per engine id, the exchanges whose attempt there has no response byte yet: the proxy
    tells them when their engine leaves (`engine_left`). Insertion-ordered dicts as sets."""
    first_byte_timeout: float | None
    access: AccessLog
    stalls: StallWatch | None = None
    """Told when requests start waiting on an engine; None: no stall watch."""
    resume_limit: int = 0
    """Resumes of one broken stream on another engine (`--stream-resume-limit`); 0: off."""
    streaming: dict[str, dict[Exchange, None]] = field(default_factory=dict)
    """Per engine id, the exchanges streaming a resumable answer from it: told, like the
    waiting ones, when their engine leaves (`engine_left`)."""


class Exchange(ResponseListener):
    """One proxied request from routing to its single end: attempts, failover, streaming back.

    It is the upstream connection's `ResponseListener` and the client connection's
    `ExchangeListener`. Every path out goes through `_end`, and every attempt's
    engine counter through `_release`, which forgets the engine it releases.
    """

    __slots__ = (
        "_bytes_out",
        "_conn",
        "_context",
        "_done",
        "_drawn",
        "_engine",
        "_failed_on",
        "_failovers",
        "_features",
        "_gap_from",
        "_head_sent",
        "_identity",
        "_last",
        "_loop",
        "_path",
        "_paused",
        "_prefill",
        "_request_id",
        "_resend",
        "_responder",
        "_resumed_from",
        "_resumes",
        "_seam",
        "_seam_open",
        "_stale_retried",
        "_started",
        "_status",
        "_stored",
        "_streaming_in",
        "_suspect",
        "_task",
        "_ticket",
        "_timer",
        "_transcript",
        "_tried",
        "_ttfb",
        "_usage",
        "_usage_tap",
        "_waiting_in",
        "_whole",
        "_whole_size",
        "_wire",
    )

    def __init__(
        self,
        context: ExchangeContext,
        responder: Responder,
        loop: asyncio.AbstractEventLoop,
        features: RequestFeatures,
        started: float,
        request_id: bytes,
        wire: tuple[bytes, bytes, bytes],
        path: bytes,
        ticket: Ticket | None = None,
        identity: object = None,
        *,
        stored: StoredResponses | None = None,
    ) -> None:
        """`wire`: the request line, headers after `host` (blank line included), the body;
        `path` the request's, for the access log. `ticket`: flow control's hold, given back
        at the end with the usage the answer reports (`_meter`). `identity`: the
        request's (its tenant, with client keys), for the access log. `stored`, for a
        Responses create: learns which engine stores the response it answers."""
        self._context = context
        self._responder = responder
        self._loop = loop
        self._features = features
        self._started = started
        self._request_id = request_id
        self._wire = wire
        self._path = path
        self._engine: Engine | None = None
        self._last: Engine | None = None
        self._bytes_out = 0
        self._conn: UpstreamConnection | None = None
        self._task: asyncio.Task[None] | None = None
        self._tried: list[str] = []
        self._failovers = 0
        self._stale_retried = False
        self._head_sent = False
        self._paused = False
        self._done = False
        self._status = 0
        self._suspect: Engine | None = None
        self._ttfb: float | None = None
        self._waiting_in: dict[Exchange, None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._prefill: tuple[EngineLoad, int] | None = None
        self._ticket = ticket
        self._transcript: Transcript | None = None
        self._streaming_in: dict[Exchange, None] | None = None
        self._seam: Seam | None = None
        self._seam_open = False
        self._resend: tuple[bytes, bytes, bytes] | None = None
        self._resumes = 0
        self._resumed_from = ""
        self._gap_from = 0.0
        self._whole: tuple[ResponseHead, list[bytes]] | None = None
        self._whole_size = 0
        self._stored = stored
        self._identity = identity
        self._failed_on = ""
        """Each engine an attempt failed on, with its failure, in order (for the access log)."""
        self._usage: tuple[int | None, int | None] | None = None
        """The tokens a whole answer reported, when read for flow control or the log."""
        self._usage_tap: UsageTap | None = None
        """What reads a streamed answer's tokens (and may drop its usage event) on its way to
        the client: every piece after the head goes through it (`_write`)."""
        self._drawn = False
        """Whether the access log's sampling chose this request (drawn when its head came)."""

    def begin(self, engine: Engine) -> None:
        self._tried.append(engine.id)
        self._attempt(engine, fresh=False)

    # -- attempts -----------------------------------------------------------------------------

    def _attempt(self, engine: Engine, fresh: bool) -> None:
        self._engine = self._last = engine
        load = engine.load
        load.in_flight += 1
        load.awaiting += 1
        load.requests += 1
        context = self._context
        waiting = context.waiting.get(engine.id)
        if waiting is None:
            waiting = context.waiting[engine.id] = {}
        waiting[self] = None
        self._waiting_in = waiting
        if len(waiting) == 1 and context.stalls is not None:
            context.stalls.watch(engine, self._loop)
        kv = self._features.kv
        if kv is not None:
            self._prefill = (load, kv.dispatch(engine))
        if context.first_byte_timeout is not None:
            self._timer = self._loop.call_later(context.first_byte_timeout, self._first_byte_late)
        pool = context.upstreams.pool(engine.id, engine.url)
        conn = None if fresh else pool.take()
        if conn is None:
            self._task = self._context.spawn(self._open(pool))
        else:
            self._send(conn, pool)

    async def _open(self, pool: UpstreamPool) -> None:
        try:
            conn = await pool.connect()
        except UpstreamError as error:
            self._task = None
            self.on_upstream_error(error)
            return
        except Exception:
            self._task = None
            self._crash()
            return
        self._task = None
        if self._done:
            conn.close()
        else:
            self._send(conn, pool)

    def _send(self, conn: UpstreamConnection, pool: UpstreamPool) -> None:
        self._conn = conn
        line, tail, body = self._resend or self._wire
        conn.send(b"".join((line, pool.host_header, tail, body)), self)
        if self._paused:
            conn.pause_reading()

    def _next_engine(self) -> Engine | None:
        """Another engine for this request, if failovers remain and one is left untried."""
        if self._failovers >= self._context.max_failovers:
            return None
        engine = self._untried()
        if engine is not None:
            self._failovers += 1
        return engine

    def _untried(self) -> Engine | None:
        """The policy's choice among the model's candidates not tried yet, now tried (none
        for a request only its first engine can answer)."""
        if isinstance(self._features, PinnedFeatures):
            return None
        tried = self._tried
        candidates = self._context.fleet.snapshot.candidates(self._features.model)
        remaining = [engine for engine in candidates if engine.id not in tried]
        policy = self._context.policy
        engine = policy.select(remaining, self._features) if remaining else None
        if engine is not None:
            tried.append(engine.id)
            if self._ticket is not None:
                self._ticket.moved(engine)
        return engine

    def _release(self, failed: bool) -> None:
        """The one place an attempt gives its engine's in-flight slot back."""
        engine = self._engine
        if engine is None:
            return
        self._engine = None
        load = engine.load
        self._unwait(load)
        streaming = self._streaming_in
        if streaming is not None:
            self._streaming_in = None
            streaming.pop(self, None)
        load.in_flight -= 1
        if failed:
            load.failures += 1

    def _unwait(self, load: EngineLoad) -> None:
        """The attempt waits for a first byte no more: out of the waiting set, timer off."""
        waiting = self._waiting_in
        if waiting is not None:
            self._waiting_in = None
            waiting.pop(self, None)
            load.awaiting -= 1
        timer = self._timer
        if timer is not None:
            self._timer = None
            timer.cancel()
        prefill = self._prefill
        if prefill is not None:
            self._prefill = None
            prefill[0].prefill_queued -= prefill[1]

    def _release_after(self, engine: Engine, error: UpstreamError) -> None:
        """Give the attempt's slot back after `error`: unless it is blameless, counted against
        the engine, which a connect failure also ejects."""
        self._note_failure(engine, error.reason)
        blamed = not isinstance(error, _BLAMELESS)
        self._release(failed=blamed)
        if blamed:
            if isinstance(error, ConnectFailed):
                self._context.fleet.eject(engine.id, f"connect failed: {error}")
            self._count_error(engine, GATEWAY_ERROR)

    def _note_failure(self, engine: Engine, failure: str) -> None:
        entry = f"{engine.spec.name}:{failure}"
        self._failed_on = f"{self._failed_on},{entry}" if self._failed_on else entry

    def _count_error(self, engine: Engine, reason: str) -> None:
        if self._context.fleet.record_error(engine.id, reason):
            self._context.metrics.outlier_ejected(reason)

    # -- giving up on a silent engine ---------------------------------------------------------

    def engine_left(self, snapshot: Snapshot, removed: bool) -> None:
        """The engine this attempt waits on or streams from left rotation (or the fleet, when
        `removed`): fail over now, or resume the stream elsewhere, unless it is still a
        candidate for the model (panic routing)."""
        engine = self._engine
        streaming = self._streaming_in is not None
        if self._done or engine is None or (self._waiting_in is None and not streaming):
            return
        if not removed and any(
            candidate.id == engine.id for candidate in snapshot.candidates(self._features.model)
        ):
            return
        what = "left the fleet" if removed else "left rotation"
        if self._waiting_in is None:
            self._break_stream(f"engine {engine.spec.name} {what} while streaming")
            return
        reason = "engine_removed" if removed else "engine_left_rotation"
        self._abandon(Abandoned(f"engine {engine.spec.name} {what} before answering", reason))

    def _break_stream(self, why: str) -> None:
        """Stop reading a stream whose engine is gone, and resume it elsewhere."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            self._gap_from = conn.last_read
            conn.cancel()
        self._release(failed=False)
        self._resume_or_cut(why)

    def stalled(self, message: str) -> None:
        """The engine this attempt waits on sent nobody a first byte for too long
        (`stalls.py`, which ejects it): fail over now."""
        if self._done or self._engine is None or self._waiting_in is None:
            return
        self._abandon(Abandoned(message, "engine_stalled"))

    def _first_byte_late(self) -> None:
        self._timer = None
        if self._done or self._waiting_in is None:
            return
        timeout = self._context.first_byte_timeout
        self._abandon(FirstByteTimeout(f"no response byte within {timeout:g}s"))

    def _abandon(self, error: UpstreamError) -> None:
        """Stop waiting on the current attempt (connecting or sent) and recover from `error`."""
        conn = self._conn
        if conn is not None and conn.answering:
            return  # bytes are arriving: the read timeout governs from here
        task = self._task
        if task is not None:
            self._task = None
            task.cancel()
        if conn is not None:
            self._conn = None
            conn.cancel()
        self.on_upstream_error(error)

    # -- ResponseListener ---------------------------------------------------------------------

    def on_response(self, head: ResponseHead | None, body: bytes, complete: bool) -> None:
        if self._done:
            return
        if complete:
            self._conn = None  # already back in its pool: a pause while writing must not reach it
        self._bytes_out += len(body)
        try:
            if head is None:
                transcript = self._transcript
                if transcript is not None:
                    self._relay(transcript, body, complete)
                elif self._whole is None:
                    self._write(body, complete)
                else:
                    self._hold(body, complete)
            elif self._failed_over(head, complete):
                return
            elif self._head_sent:
                if not self._continued(head, body, complete):
                    return
            else:
                self._ttfb = self._loop.time() - self._started
                self._status = head.status
                if not complete and head.status == 200 and self._context.resume_limit:
                    body = self._follow(head, body)
                if self._whole is None:
                    self._start(head, body, complete)
            if complete:
                engine = self._engine
                if engine is not None and self._status < 500:
                    engine.load.consecutive_errors = 0  # a whole answer: the engine works
                self._release(failed=False)
                self._end(self._status, RESUMED if self._resumes else whole(self._status))
        except Exception:
            self._crash()

    def _start(self, head: ResponseHead, body: bytes, complete: bool) -> None:
        """Send the client the head (and `body`, the answer's first part)."""
        self._head_sent = True
        block = response_headers(head.headers, self._request_id)
        if self._stored is not None:
            self._responder = IdTap(self._responder, self._learned)
        kv, engine = self._features.kv, self._engine
        if kv is not None and engine is not None:
            block += kv.receipt(engine)
        ticket = self._ticket
        drawn = self._drawn = 200 <= head.status < 300 and self._context.access.draw()
        if ticket is not None:
            if len(ticket.headers):  # compiled, `+` copies both sides even when one is empty
                block += ticket.headers
            self._meter(ticket, head, body, complete)
        elif drawn or self._failovers:  # a line will be written: read the tokens for it
            if complete:
                self._usage = usage_of(body)
            else:
                self._tap(head, drop_usage=False)
        tap = self._usage_tap
        if tap is not None:
            body = tap.through(body, complete)
        self._responder.start(head.status, head.reason, block, head.content_length, body, complete)

    def _write(self, body: bytes, complete: bool) -> None:
        """The answer's next part to the client, through the usage tap if there is one."""
        tap = self._usage_tap
        if tap is not None:
            body = tap.through(body, complete)
        self._responder.write(body, complete)

    def _learned(self, response_id: str) -> None:
        """The answer, from the engine last tried, is the stored response `response_id`."""
        stored, engine = self._stored, self._last
        if stored is not None and engine is not None:
            stored.learn(response_id, engine, self._features.model)

    # -- resuming a broken answer -------------------------------------------------------------

    def _follow(self, head: ResponseHead, body: bytes) -> bytes:
        """A 200 whose body is still coming. A stream is followed: what is relayed is kept
        (whole events only) and its engine's leaving heard of; the part of `body` to send now
        is returned. Any other answer is held whole (`_hold`): broken, it is asked again."""
        if self._path not in _KINDS:
            return body
        if not is_event_stream(find_header(head.headers, b"content-type")):
            self._whole = (head, [body])
            self._whole_size = len(body)
            return body
        self._transcript = transcript = Transcript()
        self._stream_from()
        return transcript.relay(body)

    def _hold(self, body: bytes, complete: bool) -> None:
        """The next part of an answer held whole; sent once complete (or once too large to
        hold: then it is relayed as it comes, and no longer asked again)."""
        held = self._whole
        if held is None:
            return
        head, parts = held
        parts.append(body)
        self._whole_size += len(body)
        if complete or self._whole_size > _WHOLE_MAX:
            self._whole = None
            self._start(head, b"".join(parts), complete)

    def _ask_again(self, why: str) -> bool:
        """An answer held whole broke before the client got a byte: ask another engine for
        it, within the resume limit. False when none is asked."""
        context = self._context
        engine = None if self._resumes >= context.resume_limit else self._untried()
        if engine is None:
            return False
        self._left_broken()
        context.metrics.stream_resumed(self._features.model, RETRIED)
        _log.info(
            "answer %s for model %r asked again of engine %s after %s (%d of at most %d)",
            self._request_id.decode("latin-1"),
            self._features.model,
            engine.spec.name,
            why,
            self._resumes,
            context.resume_limit,
        )
        self._attempt(engine, fresh=True)
        return True

    def _stream_from(self) -> None:
        """List this exchange under its engine's streams (`engine_left`)."""
        engine = self._engine
        if engine is not None:
            streaming = self._context.streaming.get(engine.id)
            if streaming is None:
                streaming = self._context.streaming[engine.id] = {}
            streaming[self] = None
            self._streaming_in = streaming

    def _relay(self, transcript: Transcript, body: bytes, complete: bool) -> None:
        seam = self._seam
        if seam is not None:
            body = seam.rewrite(body)
            if complete:
                body += seam.rest()
        body = transcript.relay(body)
        if complete:
            rest = transcript.rest()
            if len(rest):  # compiled, `+` copies both sides even when one is empty
                body += rest
        if len(body) or complete:
            self._write(body, complete)

    def _continued(self, head: ResponseHead, body: bytes, complete: bool) -> bool:
        """The head of a continuation: relay its events after the client's, or, when it is no
        stream (refused, failed), resume again or cut. False when the request went on."""
        transcript = self._transcript
        if (
            transcript is None
            or head.status != 200
            or not is_event_stream(find_header(head.headers, b"content-type"))
        ):
            conn = self._conn
            self._conn = None
            if conn is not None:  # None when the answer was complete: the connection is pooled
                conn.cancel()
            engine = self._engine
            self._release(failed=head.status >= 500)
            name = "?" if engine is None else engine.spec.name
            self._resume_or_cut(f"engine {name} answered the continuation with {head.status}")
            return False
        self._seam_open = False
        model = self._features.model
        self._context.metrics.stream_resumed(model, RESUMED, self._loop.time() - self._gap_from)
        self._stream_from()
        self._relay(transcript, body, complete)
        return True

    def _resume_or_cut(self, why: str) -> None:
        """The stream broke after its first byte (`why`): go on from its text on another
        engine (`resume.py`), or cut it."""
        context, model = self._context, self._features.model
        if self._seam_open:
            self._seam_open = False
            context.metrics.stream_resumed(model, RESUME_FAILED)
        transcript = self._transcript
        if transcript is None:
            self._responder.abort()
            self._end(self._status, CUT)
            return
        if not self._gap_from:
            self._gap_from = self._loop.time()
        relayed = transcript.relayed()
        if relayed.done:  # the client has `[DONE]`: only the body's framing is missing
            self._write(b"", True)
            self._end(self._status, whole(self._status))
            return
        planned: bytes | str
        if self._resumes >= context.resume_limit:
            planned = LIMIT
        elif transcript.broken:
            planned = UNREADABLE
        elif len(self._wire[2]) > _RESUMABLE_BODY_MAX:
            planned = "large_body"
        else:
            planned = continuation(_KINDS[self._path], json.loads(self._wire[2]), relayed)
        engine = None if isinstance(planned, str) else self._untried()
        if isinstance(planned, str) or engine is None:
            refused = planned if isinstance(planned, str) else NO_ENGINE
            context.metrics.stream_resumed(model, "refused_" + refused)
            _log.info(
                "stream %s for model %r cut, not resumed (%s): %s",
                self._request_id.decode("latin-1"),
                model,
                refused,
                why,
            )
            self._cut(why)
            return
        self._left_broken()
        carried = relayed.completion_tokens
        self._seam = Seam(relayed.ids, carried)
        self._seam_open = True
        line, tail, _ = self._wire
        tail = tail[: tail.rindex(_LENGTH)] + _LENGTH + b"%d\r\n\r\n" % len(planned)
        self._resend = (line, tail, planned)
        _log.info(
            "stream %s for model %r resumed on engine %s after %s: %d tokens carried over "
            "(resume %d of at most %d)",
            self._request_id.decode("latin-1"),
            model,
            engine.spec.name,
            why,
            carried,
            self._resumes,
            context.resume_limit,
        )
        self._attempt(engine, fresh=True)

    def _left_broken(self) -> None:
        """Count a resume, away from the engine last tried (for the access log)."""
        failed = self._last
        name = "?" if failed is None else failed.spec.name
        self._resumed_from = f"{self._resumed_from},{name}" if self._resumes else name
        self._resumes += 1

    def _cut(self, why: str) -> None:
        """End a stream that will not be resumed: an error event the client can read (it is
        at an event boundary), then the connection closed with the body unterminated."""
        answer = upstream_failed(GATEWAY_ERROR, why, len(self._tried))
        self._write(b"data: " + answer.body + b"\n\n", False)
        self._responder.abort()
        self._end(self._status, CUT)

    def _failed_over(self, head: ResponseHead, complete: bool) -> bool:
        """The head is here: the attempt waits no more, and its status feeds outlier detection
        (module docstring). True when another engine takes the request: one answering 502/503
        did no work, one answering another 5xx is a suspect the next answer clears or blames."""
        engine = self._engine
        if engine is None:
            return False
        load = engine.load
        load.answered += 1
        self._unwait(load)
        status = head.status
        if status < 500:
            suspect = self._suspect
            if suspect is not None:  # another engine answers what the suspect could not
                self._suspect = None
                self._count_error(suspect, HTTP_5XX)
            if status < 300 and self._features.kv is not None:
                self._features.kv.prefilled(engine)
            return False
        self._note_failure(engine, str(status))
        gateway = status in _FAILOVER_STATUSES
        if gateway:
            self._count_error(engine, HTTP_5XX)
        elif self._suspect is not None:
            self._suspect = None  # a second engine's 5xx for it: the request is at fault
            return False
        retry = self._next_engine()
        if retry is None:
            load.failures += 1  # the client gets this engine's failure
            if not gateway:
                self._count_error(engine, HTTP_5XX)  # nothing to tell it by
            return False  # the last engine's answer is the best one the client can get
        if not gateway:
            self._suspect = engine
        conn = self._conn
        self._conn = None
        if conn is not None:  # None when the answer was complete: the connection is pooled
            conn.cancel()
        self._release(failed=True)
        self._context.metrics.failover(_FAILOVER_REASONS.get(status, _SUSPECT_5XX))
        self._attempt(retry, fresh=False)
        return True

    def on_upstream_error(self, error: UpstreamError) -> None:
        conn = self._conn
        self._conn = None
        if self._done:
            return
        if conn is not None and self._head_sent and not self._seam_open:
            self._gap_from = conn.last_read
        try:
            self._recover(error)
        except Exception:
            self._crash()

    def _recover(self, error: UpstreamError) -> None:
        engine = self._engine
        if engine is None:
            raise RuntimeError("upstream error with no engine attempted")
        context = self._context
        if self._head_sent:
            self._release_after(engine, error)
            self._resume_or_cut(str(error))
            return
        if self._whole is not None:  # broken before the client got a byte: ask again
            self._whole = None
            self._release_after(engine, error)
            if not self._ask_again(str(error)):
                self._fail(upstream_failed(error.reason, str(error), len(self._tried)))
            return
        if isinstance(error, StaleConnection) and not self._stale_retried:
            self._stale_retried = True
            self._release(failed=False)
            self._attempt(engine, fresh=True)
            return
        if isinstance(error, LocalResourceExhausted):
            self._release(failed=False)  # the router's trouble: no engine is blamed or tried
            context.metrics.local_resource_error(error.resource)
            resource = _RESOURCE_NAMES.get(error.resource, error.resource)
            self._fail(overloaded(f"the router is out of {resource} ({error}); retry later"))
            return
        self._release_after(engine, error)
        if isinstance(error, _FAILOVER_ERRORS):
            retry = self._next_engine()
            if retry is not None:
                context.metrics.failover(error.reason)
                self._attempt(retry, fresh=False)
                return
        tries, model = len(self._tried), self._features.model
        if isinstance(error, UpstreamTimeout):
            self._fail(upstream_timed_out(str(error), tries))
        elif isinstance(error, Abandoned) and not context.fleet.snapshot.candidates(model):
            fleet = context.fleet  # 503: none left at all
            self._fail(unroutable(fleet.snapshot, model, fleet.unroutable_reason)[0])
        else:
            self._fail(upstream_failed(error.reason, str(error), tries))

    # -- ExchangeListener ---------------------------------------------------------------------

    def client_lost(self) -> None:
        if self._done:
            return
        task = self._task
        if task is not None:
            self._task = None
            task.cancel()
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.cancel()
        self._release(failed=False)
        self._end(self._status if self._head_sent else CLIENT_CLOSED_STATUS, CLIENT_CLOSED)

    def client_paused(self) -> None:
        self._paused = True
        if self._conn is not None:
            self._conn.pause_reading()

    def client_resumed(self) -> None:
        self._paused = False
        if self._conn is not None:
            self._conn.resume_reading()

    # -- endings ------------------------------------------------------------------------------

    def _fail(self, answer: ErrorAnswer) -> None:
        headers = JSON_HEADER + b"x-request-id: %s\r\n" % self._request_id
        if self._ticket is not None:
            headers += self._ticket.headers
        self._responder.respond(answer.status, headers, answer.body)
        self._bytes_out = len(answer.body)
        self._end(answer.status, whole(answer.status))

    def _crash(self) -> None:
        _log.exception("proxying a request for model %r failed", self._features.model)
        if self._done:
            return
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.cancel()
        self._release(failed=False)
        if self._head_sent:
            self._responder.abort()
            self._end(self._status, CUT)
        else:
            self._fail(INTERNAL_ERROR)

    def _end(self, status: int, outcome: str) -> None:
        """The request's single end: `status` the client saw, `outcome` how it ended."""
        self._done = True
        suspect = self._suspect
        if suspect is not None:  # no other engine answered: the 5xx counts after all
            self._suspect = None
            self._count_error(suspect, HTTP_5XX)
        ticket = self._ticket
        if ticket is not None:
            self._settle(ticket, status)
        duration = self._loop.time() - self._started
        context, model = self._context, self._features.model
        context.metrics.request_done(model, status, outcome, duration, self._ttfb)
        if context.access.wants(
            self._drawn
            or not 200 <= status < 300
            or outcome == CUT
            or self._failovers > 0
            or self._resumes > 0
        ):
            context.access.write(self._entry(status, outcome, duration))

    def _meter(self, ticket: Ticket, head: ResponseHead, body: bytes, complete: bool) -> None:
        """Read the tokens the answer reports: at once from an answer whole in its first read
        (the common unstreamed one), else through a tap on its way to the client."""
        if complete and ticket.forward is None:
            numbers = usage_of(body)
            if numbers is not None:
                self._usage = numbers
                self._ticket = None  # given back now: the end has nothing left to settle
                ticket.done(numbers[0], numbers[1])  # not `*numbers`: a Python call, compiled
            return
        self._tap(head, drop_usage=ticket.forward is not None)

    def _tap(self, head: ResponseHead, drop_usage: bool) -> None:
        """Read the tokens the answer reports as it passes, on its way to the client (`_write`:
        a native call per piece, where a responder in front of the client's was a Python one)."""
        content_type = find_header(head.headers, b"content-type")
        self._usage_tap = UsageTap.for_response(content_type, drop_usage)

    def _settle(self, ticket: Ticket, status: int) -> None:
        """Give flow control its hold back, with the tokens the answer reported."""
        tap = self._usage_tap
        ticket.settle(None if tap is None else tap.reported(), status)

    def _dropped(self) -> int:
        tap = self._usage_tap
        return 0 if tap is None else tap.dropped

    def _entry(self, status: int, outcome: str, duration: float) -> AccessEntry:
        engine, kv = self._last, self._features.kv
        return AccessEntry(
            request_id=self._request_id,
            method=self._wire[0].partition(b" ")[0],
            path=self._path,
            model=self._features.model,
            engine=None if engine is None else engine.spec.name,
            status=status,
            outcome=outcome,
            ttfb=self._ttfb,
            duration=duration,
            bytes_in=len(self._wire[2]),
            bytes_out=self._bytes_out - self._dropped(),
            failovers=self._failovers,
            cut=outcome == CUT,
            cached_tokens=None if kv is None or engine is None else kv.predicted.get(engine.id, 0),
            resumed_from=self._resumed_from or None,
            tried=self._failed_on or None,
            tenant=tenant_name(self._identity),
            tokens=self._tokens(),
        )

    def _tokens(self) -> tuple[int | None, int | None] | None:
        """The tokens the answer reported, as read for flow control or the log (None: not read)."""
        tap = self._usage_tap
        if tap is not None:
            reported = tap.reported()
            if reported is not None:
                return reported
        return self._usage
