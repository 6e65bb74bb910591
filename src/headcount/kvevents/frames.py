"""vLLM's KV-event ZMQ frames: the live PUB message, the replay request, the replay reply.

- PUB (both layouts): `[topic, seq, payload]`; `seq` is 8 bytes big-endian and
  counts from 0 per publisher, so an engine that restarts starts again at 0.
- Replay: a DEALER sends `[b"", start_seq]` to the engine's ROUTER socket and
  receives every buffered batch from `start_seq` on, oldest first, then an end
  marker whose seq is -1 (8 bytes signed). As the DEALER receives them:

  | layout    | each batch                    | end marker                  |
  |-----------|-------------------------------|-----------------------------|
  | `0.10`    | `[b"", seq, payload]`         | `[b"", END_SEQ, b""]`       |
  | `current` | `[b"", topic, seq, payload]`  | `[b"", b"", END_SEQ, b""]`  |

  A reply that starts after `start_seq` means the batches in between have left
  the engine's bounded buffer: a gap replay cannot fill.
"""

from __future__ import annotations

from collections.abc import Sequence

from headcount.kvevents.errors import KvEventDecodeError
from headcount.kvevents.layouts import Layout

__all__ = [
    "END_SEQ",
    "frame_seq",
    "parse_replay_reply",
    "pub_frames",
    "replay_end",
    "replay_reply",
    "replay_request",
    "seq_frame",
]

END_SEQ = -1
"""The seq of the end marker that closes every replay reply."""


def seq_frame(seq: int) -> bytes:
    """A sequence number as vLLM frames it: 8 bytes, big-endian (-1 as all ones)."""
    return seq.to_bytes(8, "big", signed=True)


def frame_seq(frame: bytes) -> int:
    """The sequence number in a frame; `END_SEQ` for the end marker."""
    if len(frame) != 8:
        raise KvEventDecodeError(f"a sequence frame has 8 bytes, not {len(frame)}")
    return int.from_bytes(frame, "big", signed=True)


def pub_frames(topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """One live batch as the PUB socket sends it."""
    return [topic, seq_frame(seq), payload]


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends to ask for every buffered batch from `start_seq` on."""
    return [b"", seq_frame(start_seq)]


def replay_reply(layout: Layout, topic: bytes, seq: int, payload: bytes) -> list[bytes]:
    """One replayed batch as the DEALER receives it (the ROUTER prepends the identity)."""
    if layout == "0.10":
        return [b"", seq_frame(seq), payload]
    return [b"", topic, seq_frame(seq), payload]


def replay_end(layout: Layout) -> list[bytes]:
    """The end marker that closes a replay, as the DEALER receives it."""
    return replay_reply(layout, b"", END_SEQ, b"")


def parse_replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """`(seq, payload)` of one message a DEALER received, in either layout;
    `seq == END_SEQ` is the end of the replay."""
    if len(frames) not in (3, 4) or frames[0] != b"":
        raise KvEventDecodeError(f"not a replay reply: {len(frames)} frames")
    return frame_seq(frames[-2]), frames[-1]
