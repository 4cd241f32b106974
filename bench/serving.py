"""`kvstore bench serving`: real `vllm serve` processes driven over the OpenAI API by concurrent multi-turn
sessions (bench.serving_workload: a shared system prompt, a long context each, several turns with the
answers appended, arrival times from the Mooncake conversation trace), the sessions' KV at least 4x
vLLM's own KV pool. Four runs, each a fresh server: vLLM alone (its prefix cache on); vLLM + kvstore with
an empty daemon (cold: first turns have nothing to reuse); the same sessions again beside that daemon
(host: every chunk in its host tier, as for a restarted or second engine); and after a daemon restart
(NVMe: every chunk read from disk). Each then also runs
`vllm bench serve` on its prefix-repetition dataset, as vLLM users run it. A full invocation makes every
run twice, the second time in the other order (ORDERS), and reports the means with the machine's load
average beside each. Every figure is a ratio to vLLM alone in the same invocation. Model: bench.serving_model (dummy weights). Needs the integration
environment (scripts/integration_env.sh).
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.bench_serve import PrefixRepetition, bench_serve
from bench.common import Record, print_records, record
from bench.proc_cpu import cpu_seconds
from bench.serving_client import drive
from bench.serving_model import MODEL, kv_bytes_per_token, write_model
from bench.serving_plot import plot_runs
from bench.serving_workload import Workload, make_sessions
from bench.vllm_server import ServeSpec, VLLMServer, live_group_members
from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from service.process import Daemon, write_config

BLOCK, CHUNK, POOL_SHARE = 32, 256, 4  # the sessions' KV is POOL_SHARE x vLLM's pool
# 16 sessions: the pool (1/POOL_SHARE of their KV) then holds ~3 of the longest prompts, so vLLM runs several
# requests at once. With 8 (the first sizing) it held ~1.5 and ran them one by one: vLLM admits a new request
# only when its whole prompt fits the free blocks (scheduler_reserve_full_isl), computed or loaded alike.
FULL = Workload(num_sessions=16, num_turns=3, system_tokens=256, context_tokens=512, message_tokens=32,
                answer_tokens=16)
QUICK = Workload(num_sessions=12, num_turns=2, system_tokens=256, context_tokens=384, message_tokens=32,
                 answer_tokens=16)
KEEP_ENV = "KVSTORE_BENCH_SERVING_KEEP"
PER_ORDER = ("ttft_mean", "ttft_later_turns", "tpot_mean", "vllm_queue_s", "vllm_cpu_s", "load_avg_1m")  # also recorded for each order
DAEMON_START_S = 300  # imports alone take a minute on a loaded 2-core machine
BASELINE = "vllm"
RUNS = (BASELINE, "kvstore_cold", "kvstore_host", "kvstore_nvme")
# Full runs go twice, the second time in the other order: on a shared machine the load drifts during the
# ~30 minutes, and one order alone credits whichever runs at the quieter time (figures are the means).
ORDERS = ((BASELINE, "kvstore"), ("kvstore", BASELINE))


@dataclass(frozen=True, slots=True)
class Setup:
    """What every run of one invocation shares."""

    model_dir: Path
    workload: Workload
    num_blocks: int
    prefix_repetition: PrefixRepetition


def run(quick: bool = False, plot: Path | None = None) -> list[Record]:
    """The invocation; with KVSTORE_BENCH_SERVING_KEEP=DIR its work (vLLM's and the daemon's logs) stays in DIR.
    `plot`: where to draw the chart of the runs (`kvstore bench serving --plot PATH`); none is drawn without it."""
    keep = os.environ.get(KEEP_ENV)
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="kvbench-serving-"))
    try:
        return _measure(work, QUICK if quick else FULL, quick, plot)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def pool_blocks(workload: Workload) -> int:
    """vLLM's KV pool in blocks: 1/POOL_SHARE of the sessions' KV, yet room for the longest request.

    Raises:
        ConfigError: the longest request would not fit such a pool (more sessions make the pool larger).
    """
    num_blocks = workload.total_kv_tokens // POOL_SHARE // BLOCK
    need = -(-workload.session_tokens // BLOCK) + 1  # vLLM keeps one block of its pool as a null block
    if num_blocks < need:
        raise ConfigError(f"a pool of 1/{POOL_SHARE} of the sessions' KV ({num_blocks} blocks) cannot hold one "
                          f"{workload.session_tokens}-token session ({need} blocks); add sessions or shorten them")
    return num_blocks


def _measure(work: Path, workload: Workload, quick: bool, plot: Path | None) -> list[Record]:
    num_blocks = pool_blocks(workload)
    setup = Setup(write_model(work / "model"), workload, num_blocks,
                  PrefixRepetition.covering(POOL_SHARE * num_blocks * BLOCK, prefix_tokens=512))
    per_run: dict[str, list[dict[str, float]]] = {run: [] for run in RUNS}
    for repeat, order in enumerate(ORDERS[:1 if quick else len(ORDERS)]):
        for part in order:
            if part == BASELINE:
                per_run[BASELINE].append(_serve(setup, None, work / f"{BASELINE}-{repeat}"))
            else:
                for name, figures in zip(RUNS[1:], _kvstore_runs(setup, work / f"kvstore-{repeat}"), strict=True):
                    per_run[name].append(figures)
    results = {run: _mean(figures) for run, figures in per_run.items()}
    records = _records(setup, results) + _order_records(per_run)
    print_records(_title(setup, len(per_run[BASELINE])), records)
    if plot is not None:
        plot_runs(results, RUNS, plot, _title(setup, len(per_run[BASELINE])))
    return records


def _kvstore_runs(setup: Setup, work: Path) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """A fresh daemon, three fresh vLLM servers: the cold run (the daemon starts empty: first turns are computed
    as with vLLM alone), the host run (the same sessions again, every chunk in the daemon's host tier, as for a
    restarted or second engine beside a running daemon), then the NVMe run after a daemon restart."""
    layout = KVLayout(num_layers=MODEL["num_hidden_layers"], num_kv_heads=MODEL["num_key_value_heads"],
                      head_dim=MODEL["head_dim"], dtype="float32", chunk_tokens=CHUNK)
    num_chunks = 2 * (setup.workload.total_kv_tokens + setup.prefix_repetition.total_tokens) // CHUNK + 16
    (work / "daemon").mkdir(parents=True)
    config = write_config(work / "daemon", layout=layout, host_chunks=num_chunks, nvme_chunks=num_chunks)
    daemon = Daemon(config, work / "daemon" / "daemon.log")
    try:
        daemon.start(timeout_s=DAEMON_START_S)
        cold = _serve(setup, daemon, work / "kvstore_cold")
        host = _serve(setup, daemon, work / "kvstore_host")
        daemon.stop()
        daemon.start(timeout_s=DAEMON_START_S)  # the host tier is memory: after a restart every chunk is on NVMe
        return cold, host, _serve(setup, daemon, work / "kvstore_nvme")
    finally:
        daemon.close()


def _mean(runs: list[dict[str, float]]) -> dict[str, float]:
    return {metric: statistics.fmean(run[metric] for run in runs) for metric in runs[0]}


def _serve(setup: Setup, daemon: Daemon | None, work: Path) -> dict[str, float]:
    """One fresh `vllm serve`: the sessions, then `vllm bench serve`; the figures of both."""
    connector = {"url": daemon.url, "chunk_tokens": CHUNK} if daemon is not None else None
    # vLLM checks max_model_len against the memory before it applies num_blocks: twice the pool's bytes
    spec = ServeSpec(model_dir=setup.model_dir, block_size=BLOCK, prefix_caching=True, connector=connector,
                     num_blocks=setup.num_blocks, kv_cache_bytes=2 * setup.num_blocks * BLOCK * kv_bytes_per_token(),
                     max_model_len=(setup.num_blocks - 1) * BLOCK)  # what the pool holds (one block is vLLM's null block)
    sessions = make_sessions(setup.workload)
    load_avg = os.getloadavg()[0]
    with VLLMServer(spec, work / "vllm.log").start(timeout_s=900) as server:
        assert server.proc is not None
        daemon_pids = [daemon.proc.pid] if daemon is not None and daemon.proc is not None else []
        cpu_before = (cpu_seconds(live_group_members(server.proc.pid)), cpu_seconds(daemon_pids))
        before = _vllm_counts(server)
        figures = drive(server.url, sessions, setup.workload.answer_tokens).summary()
        figures.update(_vllm_figures(before, _vllm_counts(server)))
        figures.update({f"bench_serve.{k}": v for k, v in
                        bench_serve(server, setup.model_dir, setup.prefix_repetition, work).items()})
        figures["vllm_cpu_s"] = cpu_seconds(live_group_members(server.proc.pid)) - cpu_before[0]
        figures["daemon_cpu_s"] = cpu_seconds(daemon_pids) - cpu_before[1]
    figures["load_avg_1m"] = (load_avg + os.getloadavg()[0]) / 2  # a shared machine: how busy it was meanwhile
    return figures


_VLLM_COUNTS = ("vllm:external_prefix_cache_hits_total", "vllm:request_queue_time_seconds_sum",
                "vllm:request_prefill_time_seconds_sum", "vllm:request_queue_time_seconds_count",
                "vllm:kvstore_step_loads_total", "vllm:kvstore_background_loads_total",
                "vllm:kvstore_finish_waits_total", "vllm:kvstore_finish_wait_hits_total")


def _vllm_counts(server: VLLMServer) -> dict[str, float]:
    return {name: server.metric_total(name) for name in _VLLM_COUNTS}


def _vllm_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What vLLM's own metrics say of the sessions: tokens loaded from kvstore, and where a request's time before
    its first token went (queued, i.e. waiting to be scheduled or for its load, against prefilling), per request;
    how many loads ran in the step that admitted their request and how many in the background (load pacing)."""
    delta = {name: after[name] - before[name] for name in _VLLM_COUNTS}
    requests = max(delta["vllm:request_queue_time_seconds_count"], 1.0)
    return {"kvstore_hit_tokens": delta["vllm:external_prefix_cache_hits_total"],
            "step_loads": delta["vllm:kvstore_step_loads_total"],
            "background_loads": delta["vllm:kvstore_background_loads_total"],
            "finish_waits": delta["vllm:kvstore_finish_waits_total"],  # step ends that waited for their loads
            "finish_wait_hits": delta["vllm:kvstore_finish_wait_hits_total"],  # ... and saw every one end
            "vllm_queue_s": delta["vllm:request_queue_time_seconds_sum"] / requests,
            "vllm_prefill_s": delta["vllm:request_prefill_time_seconds_sum"] / requests}


def _records(setup: Setup, results: dict[str, dict[str, float]]) -> list[Record]:
    pool_tokens = setup.num_blocks * BLOCK
    records = [record("serving.sessions_kv", setup.workload.total_kv_tokens, "tokens", "vLLM's KV pool", pool_tokens),
               record("serving.bench_serve_prefixes_kv", setup.prefix_repetition.total_tokens, "tokens",
                      "vLLM's KV pool", pool_tokens)]
    base = results[BASELINE]
    for name in RUNS[1:]:
        for metric, value in results[name].items():
            if metric == "prompt_tokens":
                continue
            records.append(record(f"serving.{name}.{metric}", value, _unit(metric), "vLLM alone (prefix cache on)",
                                  base.get(metric, float("nan"))))
    return records


def _order_records(per_run: dict[str, list[dict[str, float]]]) -> list[Record]:
    """Each order's own figures (the means hide which order a run went well in), against that order's vLLM alone."""
    records = []
    for repeat, base in enumerate(per_run[BASELINE]):
        for name in RUNS[1:]:
            for metric in PER_ORDER:
                records.append(record(f"serving.{name}.order{repeat + 1}.{metric}", per_run[name][repeat][metric],
                                      _unit(metric), f"vLLM alone, order {repeat + 1}", base[metric]))
    return records


def _unit(metric: str) -> str:
    name = metric.removeprefix("bench_serve.")
    if name == "load_avg_1m":
        return "load"
    if name.endswith("cpu_s"):
        return "CPU s"
    if name.startswith(("ttft", "tpot")) or name.endswith("_s"):
        return "s"
    if name == "throughput":
        return "tok/s"
    if name.endswith("_loads"):
        return "loads"
    if name.startswith("finish_wait"):
        return "steps"
    return "tokens" if name.endswith("tokens") else "requests"


def _title(setup: Setup, repeats: int) -> str:
    w = setup.workload
    return (f"kvstore bench serving ({repeats} x each run, means): {w.num_sessions} sessions x {w.num_turns} turns ({w.system_tokens}-token "
            f"system prompt, {w.context_tokens}-token context, {w.message_tokens}-token messages, "
            f"{w.answer_tokens}-token answers), vLLM pool {setup.num_blocks} blocks of {BLOCK} "
            f"({setup.num_blocks * BLOCK / w.longest_prompt_tokens:.1f} longest prompts), chunk {CHUNK}, CPU")
