"""Resuming broken streams: what clients see when engines crash under streaming load.

Method (the verdict is only as good as this):

- The run re-executes itself in a private network namespace (`unshare --net`,
  loopback only). 4 engines run as processes (`python -m headcount.sim.engine
  --token-delay 0.02`), each on its own loopback address (127.0.2.1-4, one
  port), so that a stream of 64 tokens lasts about 1.3 s and a crash always
  lands in the middle of some.
- Routers, one after the other, each on a fresh fleet, with the same seed and
  so the same requests and the same crash schedule: headcount (`headcount serve`
  with static engines, round robin, `--log-format json`; the `headcount` beside
  this interpreter, so `PYTHONPATH` picks the tree measured), headcount with
  `--stream-resume-limit 0` (resume off: a broken stream is cut), and vllm-router
  (round robin; it cuts). A peer not installed in `bench/.venv-peers` is skipped
  with a line (`--require-peers`: an error).
- Load (`bench/resume/traffic.py`): 64 client loops, each sending one streamed
  `/v1/chat/completions` after another (its own prompt, so its own answer;
  `max_tokens` 64; its own `x-request-id`), bounded in count and time. Every
  stream's status, end (`data: [DONE]` or broken), text, largest gap between two
  events and times are kept.
- Chaos (`bench/resume/chaos.py`): every 10 s (first at 5 s) one engine is
  killed with SIGKILL (a crash: the kernel resets its connections), round
  robin, and started again on the same address and port 2-4 s later (seeded),
  as a pod restarting; never more than one down at once. 120 s, so 12 crashes
  (`--quick`: 20 s, one every 5 s).
- Verdicts (`bench/resume/measure.py`): a stream that ended with `[DONE]` is
  intact when its text equals `answer_text(body, "chat", 64)`, the simulator's
  uninterrupted answer to the same body, word for word. A stream is resumed when
  the router's access log (`outcome=resumed`, joined by `x-request-id`) says so;
  cut when its 200 began and it broke; failed when no 200 came.
- The seam gap is measured at the client: a resumed stream's largest gap
  between two events (unresumed streams' largest gaps are shown beside it, the
  jitter a stream has anyway); headcount's own histogram
  `headcount_stream_resume_gap_seconds` beside it. Kill-to-detect: from the
  SIGKILL to the router's first log line about a stream on that engine (a
  resume, a cut or an access-log line of a cut stream, each naming the engine);
  and, at the client, from the SIGKILL to the first stream seen broken, and to
  the first event after a resumed stream's seam.

Checks (headcount with resume on; exit 1 if one fails, naming it): every
stream that ended with `[DONE]` has the uninterrupted text; no stream was cut
but those the router refused to resume with a reason (its log line and its
`refused_<reason>` count); some stream was resumed; the seam gap p99 is under
1 s. headcount not measured also exits 1.

Usage: `.venv/bin/python -m bench.resume [--duration 120] [--quick] [--seed 1]
[--targets headcount,headcount-no-resume,vllm-router] [--require-peers]`. The
report (`bench/resume/report.py`) is printed and written to
`bench/out/resume-<timestamp>.md`, logs beside it. Exit 0 all checks pass, 1 one
failed (or headcount not measured), 2 setup error.
"""
