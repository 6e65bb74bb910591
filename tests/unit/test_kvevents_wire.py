"""Proves `headcount.kvevents` reads and writes vLLM's KV-event wire as vLLM itself does.

The fixtures are the frames vLLM 0.10.1's and 0.33.0's own publishers sent (a
SUB socket's and a replay DEALER's view) next to what was published: every
payload decodes to those events, and encoding them again gives the same bytes.
The decoder also takes what a subscriber meets beyond the fixtures.
"""

from __future__ import annotations

import msgspec
import pytest

from headcount.kvevents import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvEventDecodeError,
    Layout,
    decode_batch,
    encode_batch,
    frame_seq,
    parse_replay_reply,
    pub_frames,
    replay_end,
    replay_reply,
    replay_request,
)
from tests.support.kv_fixtures import (
    TOPIC,
    VERSIONS,
    expected_batches,
    fixture,
    frames_of,
)


@pytest.mark.parametrize(("version", "layout"), VERSIONS)
def test_every_published_frame_decodes_to_the_events_vllm_published(
    version: str, layout: Layout
) -> None:
    expected = expected_batches(version)
    received = [frames_of(frames) for frames in fixture(version)["sub_frames"]]
    assert len(received) == len(expected)
    for topic, seq, payload in received:
        assert topic == TOPIC
        assert decode_batch(payload) == expected[frame_seq(seq)]


@pytest.mark.parametrize(("version", "layout"), VERSIONS)
def test_encoding_the_decoded_batches_gives_vllms_bytes_back(version: str, layout: Layout) -> None:
    for frames in fixture(version)["sub_frames"]:
        topic, seq, payload = frames_of(frames)
        assert encode_batch(decode_batch(payload), layout) == payload
        assert pub_frames(topic, frame_seq(seq), payload) == [topic, seq, payload]


@pytest.mark.parametrize(("version", "layout"), VERSIONS)
def test_a_replay_reply_parses_in_its_layout_and_holds_only_the_buffered_batches(
    version: str, layout: Layout
) -> None:
    data = fixture(version)
    expected = expected_batches(version)
    replies = [frames_of(frames) for frames in data["replay_frames"]]
    parsed = [parse_replay_reply(frames) for frames in replies]
    seqs = [seq for seq, _ in parsed]
    # Asked from 1 of a buffer of 3 batches: the reply begins after 1 when more were sent.
    assert seqs == [*sorted(expected)[-3:], END_SEQ]
    assert replies[-1] == replay_end(layout)
    for frames, (seq, payload) in zip(replies[:-1], parsed[:-1], strict=True):
        assert decode_batch(payload) == expected[seq]
        assert replay_reply(layout, TOPIC, seq, payload) == frames
    assert replay_request(1) == [b"", (1).to_bytes(8, "big")]


def test_an_event_map_with_keys_it_does_not_know_still_decodes() -> None:
    event = {
        "type": "BlockStored",
        "block_hashes": [7],
        "parent_block_hash": None,
        "token_ids": [1, 2],
        "block_size": 2,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "a_key_from_a_later_vllm": {"nested": [1, 2]},
    }
    payload = msgspec.msgpack.encode([1.5, [event], 0])
    assert decode_batch(payload).events == [BlockStored([7], None, [1, 2], 2, medium="GPU")]


def test_hashes_decode_as_sent_negative_ints_full_u64s_and_bytes() -> None:
    removed = ["BlockRemoved", [-(2**63), 2**64 - 1, b"\x00" * 32]]
    batch = decode_batch(msgspec.msgpack.encode([2.0, [removed]]))
    assert batch.events == [BlockRemoved([-(2**63), 2**64 - 1, b"\x00" * 32])]


def test_a_batch_of_two_items_has_no_rank_and_a_third_is_the_rank() -> None:
    assert decode_batch(msgspec.msgpack.encode([2.0, []])).data_parallel_rank is None
    assert decode_batch(msgspec.msgpack.encode([2.0, [], 3])).data_parallel_rank == 3


def test_events_of_both_layouts_decode_in_one_batch() -> None:
    mixed = [["AllBlocksCleared"], {"type": "AllBlocksCleared"}]
    assert decode_batch(msgspec.msgpack.encode([2, mixed])).events == [AllBlocksCleared()] * 2


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",
        msgspec.msgpack.encode({"ts": 1.0}),
        msgspec.msgpack.encode([1.0, [42]]),
        msgspec.msgpack.encode([1.0, [{"type": "BlockEvicted", "block_hashes": [1]}]]),
        msgspec.msgpack.encode([1.0, [["BlockStored", [1]]]]),
    ],
    ids=["not-msgpack", "a-map", "an-int-event", "an-unknown-type", "missing-fields"],
)
def test_what_is_not_a_batch_is_one_decode_error(payload: bytes) -> None:
    with pytest.raises(KvEventDecodeError):
        decode_batch(payload)


@pytest.mark.parametrize(
    "frames", [[b"", b"\x00" * 7, b""], [b"x", b"\x00" * 8, b""], [b"\x00" * 8, b""]]
)
def test_a_malformed_replay_reply_is_a_decode_error(frames: list[bytes]) -> None:
    with pytest.raises(KvEventDecodeError):
        parse_replay_reply(frames)
