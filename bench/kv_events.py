"""`kvstore bench kv_events`: what KV events cost a store's puts, and whether the publisher keeps up.

One process, one host tier that evicts (every put past its capacity is a BlockStored and a BlockRemoved): the
same puts with no publisher and with a `KVEventPublisher` attached, rounds alternated in both orders, best round
each; the putting thread's CPU per event handed to the listener beside its CPU per put (thread time: what other
processes do on the machine does not count); and a ZMQ SUB socket in this process counting the events that
arrive, beside the events the store emitted. Small chunks (8 KiB) make the per-event cost as large a share of a
put as it gets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from bench.common import Record, print_records, record, require_extra
from kvstore.config import StoreConfig, TierConfig
from kvstore.kv_events import BlockRemoved, BlockStored, decode_batch
from kvstore.layout import KVLayout
from kvstore.store import TieredStore
from kvstore.types import TierKind
from service.kv_events import KVEventPublisher
from service.kv_events_config import KVEventsConfig
from service.process import free_port

LAYOUT = KVLayout(num_layers=2, num_kv_heads=2, head_dim=32, dtype="float16", chunk_tokens=16)  # 8 KiB chunks


def run(quick: bool = False) -> list[Record]:
    require_extra(("zmq",), extra="events", what="kvstore bench kv_events")
    num_chunks, rounds = (2_000, 5) if quick else (20_000, 9)
    off, on, arrived, emitted, dropped = _measure(num_chunks, rounds)
    listener_us, put_us = _cpu_costs(num_chunks)
    records = [
        record("kv_events.listener_cpu", listener_us, "us/event", "put_cpu", put_us),
        record("kv_events.put_with_events", num_chunks / on, "chunks/s", "put_without_events", num_chunks / off),
        record("kv_events.events_received", arrived, "events", "events_emitted", emitted),
        record("kv_events.events_dropped", dropped, "events", "events_emitted", emitted),
    ]
    print_records(f"kvstore bench kv_events ({num_chunks} puts of {LAYOUT.chunk_bytes >> 10} KiB into a host tier "
                  f"of {num_chunks // 2} chunks, best of {rounds} alternated rounds)", records)
    return records


def _cpu_costs(num_chunks: int) -> tuple[float, float]:
    """CPU of the putting thread (time.thread_time, so other load on the machine does not count): one event
    handed to the publisher's listener, beside one put of a chunk with no publisher, in microseconds."""
    from kvstore.types import StoreEvent

    store = _store(num_chunks)
    publisher = KVEventPublisher(KVEventsConfig(enabled=True, endpoint=f"tcp://127.0.0.1:{free_port()}",
                                                replay_endpoint=None, max_queue_events=4 * num_chunks),
                                 block_size=LAYOUT.chunk_tokens)
    try:
        put = _puts(store, num_chunks, salt=99)
        start = time.thread_time()
        put()
        put_us = (time.thread_time() - start) / num_chunks * 1e6
        publisher.attach(_store(2))  # its thread drains the queue meanwhile, as in the daemon
        events = [StoreEvent("stored", i.to_bytes(16, "big"), TierKind.HOST) for i in range(num_chunks)]
        start = time.thread_time()
        for event in events:
            publisher.on_store_event(event)
        return (time.thread_time() - start) / num_chunks * 1e6, put_us
    finally:
        publisher.close()
        store.close()


def _store(num_chunks: int) -> TieredStore:
    tier = TierConfig(kind=TierKind.HOST, capacity_bytes=num_chunks // 2 * LAYOUT.chunk_bytes)
    return TieredStore(StoreConfig(layout=LAYOUT, tiers=(tier,), model_id="bench-kv-events"))


def _puts(store: TieredStore, num_chunks: int, salt: int) -> Callable[[], object]:
    chunk = torch.zeros(LAYOUT.chunk_shape, dtype=LAYOUT.torch_dtype)
    keys = [salt.to_bytes(4, "big") + i.to_bytes(12, "big") for i in range(num_chunks)]

    def put() -> None:
        for start in range(0, num_chunks, 64):
            store.put_many(keys[start:start + 64], [chunk] * len(keys[start:start + 64]))
    return put


def _measure(num_chunks: int, rounds: int) -> tuple[float, float, int, int, int]:
    """(best seconds without events, with events, events received, events emitted, events dropped)."""
    import zmq

    config = KVEventsConfig(enabled=True, endpoint=f"tcp://127.0.0.1:{free_port()}", replay_endpoint=None)
    plain, evented = _store(num_chunks), _store(num_chunks)
    publisher = KVEventPublisher(config, block_size=LAYOUT.chunk_tokens)
    context = zmq.Context()
    sub = context.socket(zmq.SUB)
    sub.connect(config.endpoint)
    sub.setsockopt_string(zmq.SUBSCRIBE, config.topic)
    emitted = [0]
    evented.add_listener(lambda event: emitted.__setitem__(0, emitted[0] + 1))
    publisher.attach(evented)
    time.sleep(0.5)  # the SUB's subscription reaches the publisher before the first put
    best = {"off": float("inf"), "on": float("inf")}
    arrived = 0
    try:
        for round_index in range(rounds + 1):  # round 0 warms up
            order = (("off", plain), ("on", evented))
            for name, store in order if round_index % 2 else order[::-1]:  # both orders
                put = _puts(store, num_chunks, salt=round_index)
                start = time.perf_counter()
                put()
                if round_index:
                    best[name] = min(best[name], time.perf_counter() - start)
            arrived += _drain(sub)
        arrived += _drain(sub, quiet_ms=500)
        dropped = evented.stats_counters.get("kv_events_dropped")
        return best["off"], best["on"], arrived, emitted[0], dropped
    finally:
        publisher.close()
        sub.close(linger=0)
        context.term()
        plain.close()
        evented.close()


def _drain(sub: Any, quiet_ms: int = 50) -> int:
    """Store events received until the stream is quiet for `quiet_ms` (the start's resync batches not counted)."""
    count = 0
    while sub.poll(quiet_ms):
        _, _, payload = sub.recv_multipart()
        count += sum(len(e.block_hashes) for e in decode_batch(payload).events
                     if isinstance(e, (BlockStored, BlockRemoved)))
    return count
