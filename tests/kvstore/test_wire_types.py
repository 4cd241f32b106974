"""The daemon's messages (kvstore/wire_types.py): every one survives msgpack and JSON, JSON spells bytes
as hex, a bad body names the field and the fix, and PutAnswer is the one PutResult conversion."""

from __future__ import annotations

import json

import msgpack
import pytest

from kvstore import wire_types
from kvstore.types import PutResult
from kvstore.wire_types import (
    ErrorAnswer,
    EventEntry,
    EventsAnswer,
    FoundAnswer,
    GetAnswer,
    HealthAnswer,
    InfoAnswer,
    KeysRequest,
    LookupAnswer,
    LookupRequest,
    Message,
    NodeEntry,
    NodesAnswer,
    PutAnswer,
    PutRequest,
    RouteAnswer,
    RouteRequest,
    SegmentAnswer,
    SegmentCloseRequest,
    SegmentRequest,
    SlotsRequest,
    TenantSummary,
    WireError,
)

K1, K2 = bytes(range(16)), bytes(range(16, 32))
MESSAGES: list[Message] = [
    LookupRequest(token_ids=[1, 2, 3]), LookupRequest(keys=[K1, K2]), RouteRequest(keys=[K1], nodes=["n1"]),
    KeysRequest(keys=[K1]), SegmentRequest(slots=4), SlotsRequest(segment="s", keys=[K1, K2], slots=[0, 1]),
    SegmentCloseRequest(segment="s"),
    InfoAnswer(tenant="t", model_id="m", layout={"num_layers": 2}, layout_fingerprint="00ff", chunk_bytes=8,
               root_key=K1, instance="i", shm_plane="segments", lease_s=3.0, max_batch_chunks=64, max_body_bytes=1),
    LookupAnswer(num_tokens=32, num_chunks=2, keys=[K1, K2]),
    PutAnswer(stored=[K1], not_stored={K2: "full"}, not_replicated={K1: "ENOSPC"}, durable=False),
    GetAnswer(found=[True, False], data=b"\x00\x01"), FoundAnswer(found=[False]),
    SegmentAnswer(id="s", socket="/tmp/x.fds", slots=2, slot_bytes=8),
    RouteAnswer(node_id="n1", cached_tokens=16, cached_tokens_by_node={"n1": 16}),
    HealthAnswer(status="ready", cluster={"redis": "ok"}), NodesAnswer(nodes=[NodeEntry(node_id="n1", load=0.5, url="u")]),
    EventsAnswer(last_id="1-0", events=[EventEntry(id="1-0", node_id="n1", kind="stored", tier="host", key=K1.hex())]),
    TenantSummary(name="a", used_bytes=8, quota_bytes=None, chunks=1, fast_lookups=0, memory_bytes=0,
                  memory_limit_bytes=1 << 30, segments=2),
    ErrorAnswer(error="BadRequestError", detail="why and the fix"),
]


@pytest.mark.parametrize("as_json", [False, True], ids=["msgpack", "json"])
@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_both_encodings(message: Message, as_json: bool) -> None:
    assert wire_types.decode(wire_types.encode(message, json=as_json), type(message), json=as_json) == message


def test_put_request_data_is_a_view_of_the_body_in_msgpack() -> None:
    body = wire_types.encode(PutRequest(keys=[K1], data=memoryview(b"chunk bytes"), layout="00ff"))
    put = wire_types.decode(body, PutRequest)
    assert isinstance(put.data, memoryview) and bytes(put.data) == b"chunk bytes" and put.keys == [K1]
    as_json = wire_types.decode(json.dumps({"keys": [K1.hex()], "data": b"ab".hex()}).encode(), PutRequest, json=True)
    assert bytes(as_json.data) == b"ab" and as_json.layout is None


def test_json_spells_every_bytes_value_as_hex_and_msgpack_keeps_them_raw() -> None:
    answer = PutAnswer.of(PutResult(stored=[K1], not_replicated={K1: "slow disk"}))
    assert json.loads(wire_types.encode(answer, json=True)) == {
        "stored": [K1.hex()], "not_stored": {}, "not_replicated": {K1.hex(): "slow disk"}, "durable": False}
    assert msgpack.unpackb(wire_types.encode(answer))["stored"] == [K1]
    # what an old client (plain msgpack, plain JSON) sends is what the messages read
    assert wire_types.decode(msgpack.packb({"keys": [K1]}), KeysRequest).keys == [K1]
    assert wire_types.decode(json.dumps({"keys": [K1.hex()]}).encode(), KeysRequest, json=True).keys == [K1]


def test_health_leaves_out_the_cluster_outside_one() -> None:
    assert json.loads(wire_types.encode(HealthAnswer(status="ready"), json=True)) == {"status": "ready"}


BAD: list[tuple[bytes, bool, str]] = [
    (b"\xc1\xff", False, "not valid msgpack"),
    (b"{not json", True, "not valid JSON"),
    (msgpack.packb([1, 2]), False, "map/object"),
    (msgpack.packb({"keys": [b"short"]}), False, "$.keys[0]"),
    (b'{"keys": ["zz"]}', True, "not hex"),
    (b'{"token_ids": [-1]}', True, "non-negative"),
    (b'{"token_ids": [[1]]}', True, "1-D"),
    (b'{"token_ids": [true]}', True, "$.token_ids[0]"),
    (b"[" * 10_000 + b"]" * 10_000, True, "nested too deeply"),
]


@pytest.mark.parametrize(("body", "as_json", "words"), BAD, ids=[w for _, _, w in BAD])
def test_a_bad_body_names_the_field_and_the_fix(body: bytes, as_json: bool, words: str) -> None:
    with pytest.raises(WireError) as refused:
        wire_types.decode(body, LookupRequest, json=as_json)
    assert words in str(refused.value)


def test_put_answer_is_the_one_conversion_of_put_result() -> None:
    result = PutResult(stored=[K1, K2], not_replicated={K2: "queue full"})
    answer = PutAnswer.of(result)
    assert not answer.durable and PutAnswer.of(PutResult(stored=[K1])).durable
    assert not PutAnswer.of(PutResult(not_stored={K1: "full"})).durable
    assert answer.to_result() == result
    merged = PutResult(stored=[K1], not_stored={K2: "full"})
    merged.merge(PutResult(stored=[K2], not_replicated={K2: "slow"}))
    assert merged == PutResult(stored=[K1, K2], not_stored={K2: "full"}, not_replicated={K2: "slow"})


def test_an_empty_json_body_is_an_empty_object() -> None:
    assert wire_types.decode(b"", LookupRequest, json=True) == LookupRequest()
