"""vLLM's KV-cache events on the wire, so a router can know what each engine's prefix cache holds.

A vLLM engine started with `--kv-events-config` publishes, on a ZMQ PUB socket,
one batch per scheduler step that stored, evicted or cleared cached blocks,
and serves past batches from a bounded buffer on a ROUTER socket for
subscribers that missed some. This package is that wire, for both layouts
vLLM has used (0.10 and current): the events as values (`events`), their
msgpack encoding and a decoder that reads either (`layouts`), and the ZMQ
frames around them (`frames`). The simulated engine publishes with it; a
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
from headcount.kvevents.layouts import LAYOUTS, Layout, decode_batch, encode_batch

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
    "decode_batch",
    "encode_batch",
    "frame_seq",
    "parse_replay_reply",
    "pub_frames",
    "replay_end",
    "replay_reply",
    "replay_request",
    "seq_frame",
]
