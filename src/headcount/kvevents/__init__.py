"""vLLM's KV-cache events on the wire, so a router can know what each engine's prefix cache holds.

A vLLM engine started with `--kv-events-config` publishes, on a ZMQ PUB socket,
one batch per scheduler step that stored, evicted or cleared cached blocks,
and serves past batches from a bounded buffer on a ROUTER socket for
subscribers that missed some. This package is that wire, for both layouts
vLLM has used (0.10 and current): the events as values (`events`), their
msgpack encoding and a decoder that reads either (`layouts`), the ZMQ
frames around them (`frames`), and batches cut into slices of bounded work
that mean what the whole meant (`slices`). The simulated engine publishes with it; a
subscriber decodes with it.
"""

from headcount.kvevents.errors import KvEventDecodeError
from headcount.kvevents.events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EventBatch,
    KvEvent,
)
from headcount.kvevents.frames import (
    END_SEQ,
    frame_seq,
    parse_replay_reply,
    pub_frames,
    replay_end,
    replay_reply,
    replay_request,
    seq_frame,
)
from headcount.kvevents.layouts import (
    LAYOUTS,
    Layout,
    RawBatch,
    decode_batch,
    decode_events,
    encode_batch,
    split_batch,
)
from headcount.kvevents.slices import SliceBound, event_blocks, slices

__all__ = [
    "END_SEQ",
    "LAYOUTS",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockHash",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "KvEvent",
    "KvEventDecodeError",
    "Layout",
    "RawBatch",
    "SliceBound",
    "decode_batch",
    "decode_events",
    "encode_batch",
    "event_blocks",
    "frame_seq",
    "parse_replay_reply",
    "pub_frames",
    "replay_end",
    "replay_reply",
    "replay_request",
    "seq_frame",
    "slices",
    "split_batch",
]
