"""`kvstore bench pd`: prefill/decode disaggregation against one colocated server, on a mixed workload.

    colocated       one `vllm serve` (kvstore connector, kv_role kv_both), all of the machine's cores
    disaggregated   a prefill `vllm serve` (kv_producer) and a decode `vllm serve` (kv_consumer), half the
                    cores each, `kvstore pd-proxy` in front, both on one kvstore daemon
    disaggregated_local_short  the same servers, the proxy with `--local-prefill-tokens` one chunk: the short
                    prompts (under one chunk) go straight to the decode server, which computes them

The same requests (bench.pd_workload: short prompts decoding while long prompts arrive, every token
streamed) go to each; every figure of the disaggregated run is printed beside the colocated one's, measured
in the same invocation. The daemon restarts (host tier only: empty) between the runs, so neither finds the
other's chunks. Needs the integration environment (scripts/integration_env.sh). Instances sharing a few
CPU cores cannot show what separate accelerators give: the caveat is printed with the table.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.common import Record, print_records, record
from bench.pd_proxy_process import PDProxy
from bench.pd_workload import LONG, SHORT, MixedWorkload, TimedRequest, drive, make_requests, summarize
from bench.serving_model import MODEL, write_model
from bench.vllm_server import Completion, ServeSpec, VLLMServer
from kvstore.layout import KVLayout
from service.process import Daemon, write_config

BLOCK, CHUNK = 32, 128  # vLLM's CPU attention takes blocks in multiples of 32
FULL = MixedWorkload(num_short=4, short_tokens=96, short_answer_tokens=96, short_gap_s=0.2, num_long=6,
                     long_tokens=1536, long_answer_tokens=4, long_start_s=0.5, long_gap_s=0.75)
QUICK = MixedWorkload(num_short=2, short_tokens=96, short_answer_tokens=48, short_gap_s=0.2, num_long=3,
                      long_tokens=1024, long_answer_tokens=4, long_start_s=0.3, long_gap_s=0.5)
SEED, LOCAL_SEED, WARMUP_SEED = 0, 1, 99
DAEMON_START_S, SERVER_START_S = 300, 900
BASELINE = "colocated (one vllm serve, kv_both)"
CAVEAT = ("caveat: the {n} CPU cores here are shared by every instance (colocated: {n} threads; disaggregated: "
          "{h} per instance) and by other work on the machine: the split cannot show what separate accelerators "
          "give. The harness is the one to run on a GPU machine.")


@dataclass(frozen=True, slots=True)
class Run:
    """What one configuration answered and what its instances counted."""

    figures: dict[str, float]
    completions: list[Completion | None]


def run(quick: bool = False) -> list[Record]:
    work = Path(tempfile.mkdtemp(prefix="kvbench-pd-"))
    try:
        return _measure(work, QUICK if quick else FULL)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(work: Path, workload: MixedWorkload) -> list[Record]:
    model_dir = write_model(work / "model")
    layout = KVLayout(num_layers=MODEL["num_hidden_layers"], num_kv_heads=MODEL["num_key_value_heads"],
                      head_dim=MODEL["head_dim"], dtype="float32", chunk_tokens=CHUNK)
    requests = make_requests(workload, SEED)
    num_chunks = 2 * sum(len(r.prompt) + r.max_tokens for r in requests) // CHUNK + 64
    (work / "daemon").mkdir()
    daemon = Daemon(write_config(work / "daemon", layout=layout, host_chunks=num_chunks, nvme_chunks=0),
                    work / "daemon" / "daemon.log")
    cores = os.cpu_count() or 2
    try:
        daemon.start(timeout_s=DAEMON_START_S)
        colocated = _colocated(model_dir, daemon, workload, requests, cores, work / "colocated")
        daemon.stop()
        daemon.start(timeout_s=DAEMON_START_S)  # host tier only: empty again
        disaggregated, local = _disaggregated(model_dir, daemon, workload, requests, max(1, cores // 2), work / "pd")
    finally:
        daemon.close()
    records = _records(requests, colocated, disaggregated, local)
    print_records(_title(workload), records)
    print(CAVEAT.format(n=cores, h=max(1, cores // 2)))
    return records


def _spec(model_dir: Path, daemon: Daemon, workload: MixedWorkload, kv_role: str, threads: int) -> ServeSpec:
    return ServeSpec(model_dir=model_dir, block_size=BLOCK, connector={"url": daemon.url, "chunk_tokens": CHUNK},
                     kv_role=kv_role, kv_cache_bytes=256 << 20, max_model_len=workload.longest_request_tokens + BLOCK,
                     omp_threads=threads)


def _warm_up(url: str, workload: MixedWorkload) -> None:
    """Two requests of each kind (their own prompts): vLLM's first steps are slower than its steady ones."""
    warm = [TimedRequest(r.kind, r.prompt, r.max_tokens, 0.0) for r in make_requests(workload, WARMUP_SEED)]
    drive(url, [next(r for r in warm if r.kind == kind) for kind in (SHORT, LONG, SHORT, LONG)])


def _colocated(model_dir: Path, daemon: Daemon, workload: MixedWorkload, requests: list[TimedRequest], cores: int,
               work: Path) -> Run:
    with VLLMServer(_spec(model_dir, daemon, workload, "kv_both", cores), work / "vllm.log").start(SERVER_START_S) as server:
        _warm_up(server.url, workload)
        done = drive(server.url, requests)
    return Run(summarize(requests, done), done)


def _disaggregated(model_dir: Path, daemon: Daemon, workload: MixedWorkload, requests: list[TimedRequest],
                   threads: int, work: Path) -> tuple[Run, Run]:
    """The requests through a proxy sending every prompt to prefill; then the same workload with other prompts
    (the store holds the first ones) through a proxy sending prompts under one chunk straight to decode."""
    prefill = VLLMServer(_spec(model_dir, daemon, workload, "kv_producer", threads), work / "prefill.log")
    decode = VLLMServer(_spec(model_dir, daemon, workload, "kv_consumer", threads), work / "decode.log")
    with prefill, decode:
        with ThreadPoolExecutor(2) as pool:  # both load at once
            for started in [pool.submit(s.start, SERVER_START_S) for s in (prefill, decode)]:
                started.result()
        with PDProxy([prefill.url], [decode.url], work / "proxy.log").start() as proxy:
            _warm_up(proxy.url, workload)
            remote = _through(proxy, decode, requests)
        with PDProxy([prefill.url], [decode.url], work / "proxy-local.log",
                     extra_args=["--local-prefill-tokens", str(CHUNK)]).start() as proxy:
            local = _through(proxy, decode, make_requests(workload, LOCAL_SEED))
    return remote, local


def _through(proxy: PDProxy, decode: VLLMServer, requests: list[TimedRequest]) -> Run:
    before = _decode_counts(decode, proxy)
    done = drive(proxy.url, requests)
    after = _decode_counts(decode, proxy)
    figures = summarize(requests, done)
    figures.update({k: after[k] - before[k] for k in after})
    return Run(figures, done)


def _decode_counts(decode: VLLMServer, proxy: PDProxy) -> dict[str, float]:
    """The decode instance's prompt tokens and those it loaded from kvstore; the proxy's fallbacks."""
    return {"decode_prompt_tokens": decode.metric_total("vllm:prompt_tokens_total"),
            "decode_loaded_tokens": decode.metric_total("vllm:external_prefix_cache_hits_total"),
            "prefill_fallbacks": proxy.metric_total("kvstore_pd_prefill_fallbacks_total"),
            "handoff_waits": decode.metric_total("vllm:kvstore_handoff_waits_total"),
            "handoff_wait_s": decode.metric_total("vllm:kvstore_handoff_wait_seconds_total"),
            "load_s": decode.metric_total("vllm:kvstore_load_seconds_total")}


def _records(requests: list[TimedRequest], colocated: Run, disaggregated: Run, local: Run) -> list[Record]:
    records = []
    for name, run in (("disaggregated", disaggregated), ("disaggregated_local_short", local)):
        for metric, value in run.figures.items():
            if metric in colocated.figures:
                unit = "requests" if metric == "failed" else "s"
                records.append(record(f"pd.{name}.{metric}", value, unit, BASELINE, colocated.figures[metric]))
    figures = disaggregated.figures
    computed = figures["decode_prompt_tokens"] - figures["decode_loaded_tokens"]
    records.append(record("pd.decode_computed_prompt_tokens", computed, "tokens", "prompt tokens the decode instance got",
                          figures["decode_prompt_tokens"]))
    records.append(record("pd.prefill_fallbacks", figures["prefill_fallbacks"], "requests", "requests", len(requests)))
    # the handoff's cost: loads that waited for chunks still on their way from the prefill instance, and how long
    records.append(record("pd.handoff_waits", figures["handoff_waits"], "loads", "requests", len(requests)))
    records.append(record("pd.handoff_wait_seconds", figures["handoff_wait_s"], "s", "decode-side load time (wait included)",
                          figures["load_s"]))
    same = sum(a is not None and b is not None and a.token_ids == b.token_ids
               for a, b in zip(disaggregated.completions, colocated.completions, strict=True))
    records.append(record("pd.identical_answers", same, "requests", "requests (temperature 0)", len(requests)))
    return records


def _title(w: MixedWorkload) -> str:
    return (f"kvstore bench pd: {w.num_short} short requests ({w.short_tokens}-token prompts, {w.short_answer_tokens}-token "
            f"answers) decoding while {w.num_long} long prompts ({w.long_tokens} tokens, {w.long_answer_tokens}-token "
            f"answers) arrive every {w.long_gap_s:g} s; block {BLOCK}, chunk {CHUNK}, CPU")
