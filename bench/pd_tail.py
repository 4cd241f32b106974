"""`kvstore bench pd_tail`: in prefill/decode disaggregation, recompute a prompt's partial last chunk on the
decode server, or transfer it? Both costs measured on real `vllm serve` processes in one run.

Two prefill servers (kv_producer), one saving whole chunks only ("recompute": the decode server computes
each prompt's r-token tail) and one saving the tail too (save_partial_chunk, "transfer": the decode server
loads it and computes only the last token), and one decode server (kv_consumer) share a daemon. Prompts of
`k * chunk + r` tokens go through the handoff (prefill with one token, then decode with the prefill's
kv_transfer_params) once their chunks are stored, alternating the two modes; the decode TTFT is timed.
Printed: both TTFTs per r (transfer as a ratio to recompute), the tail's recompute cost (TTFT at r minus
at r = 1) beside one chunk's load + gather (vLLM's `vllm:kvstore_*` counters over the same run). Model: bench.serving_model (dummy
weights, where prefill dominates on a CPU). Needs the integration environment (scripts/integration_env.sh).
"""

from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import Record, print_records, record
from bench.serving_model import MODEL, write_model
from bench.vllm_server import SERVED_MODEL, ServeSpec, VLLMServer
from connector.client import KVStoreClient
from kvstore.layout import KVLayout
from service.process import Daemon, write_config

BLOCK, CHUNK, WHOLE_CHUNKS = 32, 256, 4
MODES = ("recompute", "transfer")  # the prefill server saves whole chunks only / the partial last one too
TAILS, QUICK_TAILS = (1, 32, 64, 128, 192, 255), (1, 128, 255)
DAEMON_START_S = 300


def run(quick: bool = False) -> list[Record]:
    work = Path(tempfile.mkdtemp(prefix="kvbench-pd-tail-"))
    try:
        return _measure(work, QUICK_TAILS if quick else TAILS, 2 if quick else 4)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _spec(model: Path, url: str, role: str, *, tail: bool = False) -> ServeSpec:
    connector = {"url": url, "chunk_tokens": CHUNK, "save_partial_chunk": tail}
    return ServeSpec(model_dir=model, block_size=BLOCK, connector=connector, kv_role=role, kv_cache_bytes=512 << 20,
                     max_model_len=4096)


def _measure(work: Path, tails: tuple[int, ...], repeats: int) -> list[Record]:
    model = write_model(work / "model")
    layout = KVLayout(num_layers=MODEL["num_hidden_layers"], num_kv_heads=MODEL["num_key_value_heads"],
                      head_dim=MODEL["head_dim"], dtype="float32", chunk_tokens=CHUNK)
    (work / "daemon").mkdir()
    num_chunks = 2 * (len(tails) * repeats + 2) * (WHOLE_CHUNKS + 1) + 16
    daemon = Daemon(write_config(work / "daemon", layout=layout, host_chunks=num_chunks, nvme_chunks=0),
                    work / "daemon" / "daemon.log")
    ttft: dict[str, dict[int, list[float]]] = {mode: {} for mode in MODES}
    try:
        daemon.start(timeout_s=DAEMON_START_S)
        with (VLLMServer(_spec(model, daemon.url, "kv_producer"), work / "recompute.log").start(900) as recompute,
              VLLMServer(_spec(model, daemon.url, "kv_producer", tail=True), work / "transfer.log").start(900) as transfer,
              VLLMServer(_spec(model, daemon.url, "kv_consumer"), work / "decode.log").start(900) as consumer):
            producers = {"recompute": recompute, "transfer": transfer}
            for mode, producer in producers.items():  # warm-up: first requests pay one-time costs
                _handoff(producer, consumer, daemon, _prompt(1, 10_000 + len(mode)), mode)
            before = _counters(transfer, consumer)
            for tail in tails:
                for i in range(repeats):  # alternate the modes, so a drifting load hits both alike
                    for mode, producer in producers.items():
                        seed = i if mode == "recompute" else 5_000 + i
                        ttft[mode].setdefault(tail, []).append(_handoff(producer, consumer, daemon,
                                                                        _prompt(tail, seed), mode))
            after = _counters(transfer, consumer)
    finally:
        daemon.close()
    records = _records(ttft, {k: after[k] - before[k] for k in after})
    print_records(f"kvstore bench pd_tail: decode TTFT of {WHOLE_CHUNKS} x {CHUNK}-token chunks loaded + an "
                  f"r-token tail recomputed or handed over, median of {repeats}; 2-core CPU, the servers share "
                  f"the cores", records)
    return records


def _prompt(tail: int, seed: int) -> list[int]:
    """A prompt of WHOLE_CHUNKS chunks and `tail` tokens, its own for each (tail, seed): nothing cached yet."""
    rng = random.Random(tail * 100_000 + seed)
    return [rng.randrange(3, 1000) for _ in range(WHOLE_CHUNKS * CHUNK + tail)]


def _handoff(producer: VLLMServer, consumer: VLLMServer, daemon: Daemon, prompt: list[int], mode: str) -> float:
    """Prefill, wait until the daemon holds what it saved, then time the decode's first token."""
    saved = WHOLE_CHUNKS + (1 if mode == "transfer" and len(prompt) % CHUNK else 0)
    with KVStoreClient(daemon.url) as store:
        held = int(store.stats()["chunks"])
        params = _complete(producer.url, prompt, None)[1]
        deadline = time.monotonic() + 120
        while int(store.stats()["chunks"]) < held + saved:
            if time.monotonic() > deadline:
                raise RuntimeError("the prefill server's chunks never reached the daemon (see its log)")
            time.sleep(0.05)
    start = time.perf_counter()
    cached = _complete(consumer.url, prompt, params)[0]
    ttft = time.perf_counter() - start
    expected = len(prompt) - 1 if mode == "transfer" else min(WHOLE_CHUNKS * CHUNK, len(prompt) - 1)
    if cached != expected:
        raise RuntimeError(f"{mode}: the decode server took {cached} tokens from kvstore, not {expected}")
    return ttft


def _complete(url: str, prompt: list[int], params: dict[str, Any] | None) -> tuple[int, dict[str, Any] | None]:
    """One 1-token completion: (cached prompt tokens, the answer's kv_transfer_params)."""
    body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0.0,
            "kv_transfer_params": params if params is not None else {"do_remote_decode": True}}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=600.0)
    if answer.status_code != 200:
        raise RuntimeError(f"{url} answered {answer.status_code}: {answer.text[:1000]}")
    data = answer.json()
    cached = ((data.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return int(cached), data.get("kv_transfer_params")


def _counters(producer: VLLMServer, consumer: VLLMServer) -> dict[str, float]:
    return {"load_s": consumer.metric_total("vllm:kvstore_load_seconds_total"),
            "loaded": consumer.metric_total("vllm:kvstore_loaded_chunks_total"),
            "gather_s": producer.metric_total("vllm:kvstore_save_seconds_total"),
            "gathered": producer.metric_total("vllm:kvstore_queued_save_chunks_total")}


def _records(ttft: dict[str, dict[int, list[float]]], counters: dict[str, float]) -> list[Record]:
    load = counters["load_s"] / counters["loaded"] if counters["loaded"] else float("nan")
    gather = counters["gather_s"] / counters["gathered"] if counters["gathered"] else float("nan")
    first = min(ttft["recompute"])
    base = statistics.median(ttft["recompute"][first])
    records = [record("pd_tail.load_one_chunk", load, "s", "gather of one chunk (prefill side)", gather)]
    for tail in sorted(ttft["recompute"]):
        recompute, transfer = (statistics.median(ttft[mode][tail]) for mode in MODES)
        records.append(record(f"pd_tail.recompute.r{tail}", recompute, "s", f"recompute at r={first}", base))
        records.append(record(f"pd_tail.transfer.r{tail}", transfer, "s", "recompute (same r)", recompute))
        if tail != first:
            records.append(record(f"pd_tail.tail_cost.recompute.r{tail}", recompute - base, "s",
                                  "one chunk's load + gather", load + gather))
    return records
