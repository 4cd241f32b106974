"""KV events of a real `kvstore serve`, read by an independent ZMQ subscriber (tests/service/kv_event_subscriber.py,
decoding as vLLM's example subscriber does): puts and evictions one to one, per tier, replay of missed batches,
AllBlocksCleared on a restart and after dropped changes, the operator-only endpoint rule, and a config that
enables events without pyzmq refused in one line."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from connector.client import KVStoreClient
from kvstore.errors import ConfigError
from service.kv_events_config import kv_events_from_dict
from service.process import CLI, Daemon, free_port, write_config
from tests.conftest import make_chunk
from tests.helpers.forkserver import ForkServer
from tests.service.conftest import LAYOUT, TOKENS
from tests.service.kv_event_subscriber import AllBlocksCleared, BlockRemoved, BlockStored, Subscriber


def _events_config(**extra: Any) -> dict[str, Any]:
    return {"enabled": True, "endpoint": f"tcp://127.0.0.1:{free_port()}",
            "replay_endpoint": f"tcp://127.0.0.1:{free_port()}", **extra}


def _daemon(root: Path, events: dict[str, Any], **config: Any) -> Daemon:
    path = write_config(root, layout=LAYOUT, service={"kv_events": events}, **config)
    return Daemon(path, root / "daemon.log").start()


def _subscribe(events: dict[str, Any]) -> Subscriber:
    return Subscriber(events["endpoint"], events["replay_endpoint"])


def _keys(seed: int, n: int) -> list[bytes]:
    return [bytes([seed, i]) * 8 for i in range(n)]


def _held_by_daemon(daemon: Daemon, keys: list[bytes]) -> set[bytes]:
    with daemon.client() as http:
        return {k for k in keys if http.get(f"/v1/chunks/{k.hex()}").status_code == 200}


def _stored(sub: Subscriber) -> list[tuple[bytes | int, str | None]]:
    return [(h, e.medium) for e in sub.events(BlockStored) for h in e.block_hashes]


def _removed(sub: Subscriber) -> list[tuple[bytes | int, str | None]]:
    return [(h, e.medium) for e in sub.events(BlockRemoved) for h in e.block_hashes]


@pytest.fixture
def host_only(tmp_path: Path) -> Iterator[tuple[Daemon, dict[str, Any]]]:
    """A daemon with one host tier of 4 chunks and events on."""
    events = _events_config()
    daemon = _daemon(tmp_path, events, host_chunks=4, nvme_chunks=0)
    yield daemon, events
    daemon.close()


def test_puts_and_evictions_one_to_one(host_only: tuple[Daemon, dict[str, Any]]) -> None:
    daemon, events = host_only
    sub = _subscribe(events)
    try:
        sub.wait_for(lambda s: bool(s.batches))
        assert sub.batches[0][0] == 0 and isinstance(sub.batches[0][1].events[0], AllBlocksCleared)  # a fresh start
        keys = _keys(1, 7)
        with KVStoreClient(daemon.url, use_shm=False) as client:
            for i, key in enumerate(keys):  # one at a time: the host tier evicts the oldest as the fifth arrives
                assert client.put_many([key], [make_chunk(LAYOUT, i)]).ok
        held = _held_by_daemon(daemon, keys)
        assert len(held) == 4
        sub.wait_for(lambda s: len(_stored(s)) == len(keys) and len(_removed(s)) == len(keys) - len(held))
        assert _stored(sub) == [(k, "CPU") for k in keys]  # one BlockStored per put, in put order, its medium
        assert sorted(_removed(sub)) == sorted((k, "CPU") for k in set(keys) - held)  # one removal per eviction
        assert sub.held == {(k, "CPU") for k in held}  # the subscriber's view is the daemon's
        stored = sub.events(BlockStored)[0]
        assert (stored.block_size, stored.token_ids, stored.parent_block_hash, stored.ownership) == (
            LAYOUT.chunk_tokens, [], None, "kvstore")

        with daemon.client() as http:  # a delete is a removal too
            victim = sorted(held)[0]
            assert http.delete(f"/v1/chunks/{victim.hex()}").json() == {"removed": True}
        sub.wait_for(lambda s: (victim, "CPU") not in s.held)
        assert sub.held == {(k, "CPU") for k in held - {victim}}
        seqs = [seq for seq, _ in sub.batches]
        assert seqs == list(range(len(seqs)))  # every batch, none twice, gaps filled by replay
    finally:
        sub.close()


def test_replay_returns_the_batches_a_subscriber_missed(host_only: tuple[Daemon, dict[str, Any]]) -> None:
    daemon, events = host_only
    first = _subscribe(events)
    try:
        first.wait_for(lambda s: bool(s.batches))
        seen = first.last_seq
    finally:
        first.close()  # away while two puts happen
    keys = _keys(2, 2)
    with KVStoreClient(daemon.url, use_shm=False) as client:
        assert client.put_many(keys, [make_chunk(LAYOUT, 1), make_chunk(LAYOUT, 2)]).ok
    assert daemon.metric("kvstore_kv_events_published_total") >= 1 + len(keys)  # published while nobody listened
    back = _subscribe(events)
    try:
        back.last_seq = seen
        count = back.request_replay(seen + 1)
        assert count >= 1 and back.replayed_seqs == list(range(seen + 1, seen + 1 + count))
        assert sorted(_stored(back)) == sorted((k, "CPU") for k in keys)  # a batch put stores its tail first
    finally:
        back.close()


def test_every_tier_has_its_medium_and_a_restart_clears(tmp_path: Path) -> None:
    """Host and NVMe: a put is stored in CPU and STORAGE; an eviction from the host leaves the STORAGE copy.
    A restart starts the sequence again with AllBlocksCleared, then what the rebuilt index holds."""
    events = _events_config()
    daemon = _daemon(tmp_path, events, host_chunks=2, nvme_chunks=16)
    sub = _subscribe(events)
    keys = _keys(3, 3)
    try:
        with KVStoreClient(daemon.url, use_shm=False) as client:
            for i, key in enumerate(keys):
                assert client.put_many([key], [make_chunk(LAYOUT, i)]).ok  # durable: on disk when acknowledged
        sub.wait_for(lambda s: len(_stored(s)) == 2 * len(keys) and len(_removed(s)) == 1)
        assert sorted(_stored(sub)) == sorted([(k, "CPU") for k in keys] + [(k, "STORAGE") for k in keys])
        assert _removed(sub) == [(keys[0], "CPU")]  # the host's oldest, still on disk
        assert sub.held == {(k, "STORAGE") for k in keys} | {(k, "CPU") for k in keys[1:]}
        assert daemon.stop() == 0
    finally:
        sub.close()
        daemon.close()
    daemon.start()
    again = _subscribe(events)
    try:
        again.wait_for(lambda s: len(_stored(s)) >= len(keys))
        assert again.batches[0][0] == 0 and isinstance(again.batches[0][1].events[0], AllBlocksCleared)
        assert again.held == {(k, "STORAGE") for k in keys}  # the disk tier's chunks, rebuilt from their headers
    finally:
        again.close()
        daemon.close()


def test_dropped_changes_end_in_a_resync_that_matches_the_daemon(tmp_path: Path) -> None:
    """A queue of one change overflows under batched puts: the drops are counted and followed by
    AllBlocksCleared and the held chunks, so the subscriber's view still equals the daemon's."""
    events = _events_config(max_queue_events=1)
    daemon = _daemon(tmp_path, events, host_chunks=64, nvme_chunks=0)
    sub = _subscribe(events)
    keys: list[bytes] = []
    try:
        with KVStoreClient(daemon.url, use_shm=False) as client:
            for round_ in range(8):
                batch = _keys(10 + round_, 8)
                assert client.put_many(batch, [make_chunk(LAYOUT, i) for i in range(8)]).ok
                keys += batch
                if daemon.metric("kvstore_kv_events_dropped_total") > 0:
                    break
        assert daemon.metric("kvstore_kv_events_dropped_total") > 0
        sub.wait_for(lambda s: s.held == {(k, "CPU") for k in keys})
        assert daemon.metric("kvstore_kv_events_resyncs_total") >= 2  # the start's, and the one after the drops
    finally:
        sub.close()
        daemon.close()


def test_tenant_keys_are_published_as_store_keys(tmp_path: Path) -> None:
    """A tenant's key travels as its store key (salted), never as the key the tenant named."""
    events = _events_config()
    tenants = [{"name": "a", "token": TOKENS["a"], "salt": "salt-a"}]
    daemon = Daemon(write_config(tmp_path, layout=LAYOUT, host_chunks=8, nvme_chunks=0, tenants=tenants,
                                 service={"kv_events": events}), tmp_path / "daemon.log").start()
    sub = _subscribe(events)
    try:
        key = _keys(4, 1)[0]
        with KVStoreClient(daemon.url, token=TOKENS["a"], use_shm=False) as client:
            assert client.put_many([key], [make_chunk(LAYOUT, 0)]).ok
        sub.wait_for(lambda s: len(_stored(s)) == 1)
        published = _stored(sub)[0][0]
        assert isinstance(published, bytes) and len(published) == 16 and published != key
    finally:
        sub.close()
        daemon.close()


def test_int_block_hashes_are_the_low_64_bits(tmp_path: Path) -> None:
    events = _events_config(int_block_hashes=True)
    daemon = _daemon(tmp_path, events, host_chunks=4, nvme_chunks=0)
    sub = _subscribe(events)
    try:
        key = _keys(5, 1)[0]
        with KVStoreClient(daemon.url, use_shm=False) as client:
            assert client.put_many([key], [make_chunk(LAYOUT, 0)]).ok
        sub.wait_for(lambda s: len(_stored(s)) == 1)
        assert _stored(sub) == [(int.from_bytes(key[8:], "big"), "CPU")]
    finally:
        sub.close()
        daemon.close()


@pytest.mark.parametrize(("table", "expect"), [
    ({"endpoint": "tcp://0.0.0.0:5557"}, ["not a loopback address", "allow_remote"]),
    ({"endpoint": "udp://127.0.0.1:5557"}, ["tcp://127.0.0.1:PORT", "ipc://"]),
    ({"endpoint": "tcp://127.0.0.1:1", "replay_endpoint": "tcp://127.0.0.1:1"}, ["its own port"]),
    ({"max_queue_events": 0}, ["max_queue_events", ">= 1"]),
    ({"replay": 3}, ["unknown keys", "replay_batches"]),
    ({"int_block_hashes": "ture"}, ["int_block_hashes", "not on or off"]),
])
def test_bad_tables_are_refused_naming_the_fix(table: dict[str, Any], expect: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        kv_events_from_dict({"enabled": True, **table})
    assert all(part in str(caught.value) for part in expect), str(caught.value)


def test_remote_endpoint_needs_allow_remote_and_ipc_is_accepted() -> None:
    assert kv_events_from_dict({"endpoint": "tcp://10.0.0.5:5557", "allow_remote": True}).allow_remote
    assert kv_events_from_dict({"endpoint": "ipc:///tmp/kv.sock", "replay_endpoint": "tcp://[::1]:5558"}).endpoint


def test_enabled_without_pyzmq_is_refused_in_one_line(tmp_path: Path, fork_server: ForkServer) -> None:
    """pyzmq made unimportable for this daemon (sys.modules['zmq'] = None, as a missing package behaves)."""
    config = write_config(tmp_path, layout=LAYOUT, nvme_chunks=0, service={"kv_events": _events_config()})
    no_zmq = ["-c", "import sys; sys.modules['zmq'] = None; " + CLI[1]]
    done = fork_server.run([*no_zmq, "serve", "--config", str(config), "--port", str(free_port())],
                           env={**os.environ, "KVSTORE_CACHE_DIR": str(tmp_path / "cache")}, timeout_s=120)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("kvstore serve:")]
    assert len(lines) == 1 and "pyzmq" in lines[0] and "pip install 'kvstore[events]'" in lines[0], done.stderr


def test_wire_matches_vllm_shape() -> None:
    """The daemon's encoder (kvstore.kv_events) and this independent decoder agree field by field."""
    from kvstore import kv_events

    batch = kv_events.KVEventBatch(ts=1.5, events=[
        kv_events.BlockStored(block_hashes=[b"k" * 16], parent_block_hash=None, token_ids=[], block_size=16,
                              lora_id=None, medium="CPU", lora_name=None, ownership="kvstore"),
        kv_events.BlockRemoved(block_hashes=[7], medium="STORAGE"), kv_events.AllBlocksCleared()])
    raw = msgspec.msgpack.decode(kv_events.encode_batch(batch))
    assert raw[0] == 1.5 and raw[1][1] == {"type": "BlockRemoved", "block_hashes": [7], "medium": "STORAGE"}
    assert raw[1][2] == {"type": "AllBlocksCleared"}
    from tests.service.kv_event_subscriber import KVEventBatch

    decoded = msgspec.msgpack.decode(kv_events.encode_batch(batch), type=KVEventBatch)
    assert [type(e).__name__ for e in decoded.events] == ["BlockStored", "BlockRemoved", "AllBlocksCleared"]
