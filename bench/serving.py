"""`kvstore bench serving`: real `vllm serve` processes driven over the OpenAI API by concurrent multi-turn
sessions (bench.serving_workload: a shared system prompt, a long context or history each, several turns with the
answers appended, timed by the Mooncake conversation trace or, with `--workload qa`, by LMCache's multi-round QA),
the sessions' KV 4x vLLM's own KV pool (bench.serving_sizes). Every run starts fresh servers (bench.serving_runs):

    vllm              vLLM alone, its prefix cache on
    vllm_same_memory  vLLM alone, its pool enlarged by the bytes of kvstore's host tier (what a user tries first)
    kvstore_cold      vLLM + kvstore, the daemon empty (first turns have nothing to reuse)
    kvstore_host      the same sessions again beside that daemon (every chunk in its host tier: a second engine)
    kvstore_nvme      again after a daemon restart (every chunk read from disk)
    replicas_vllm     two replicas behind a round-robin router (turns of one session land on either), alone
    replicas_kvstore  the same, both replicas sharing one fresh daemon
    restart_vllm      two replicas, replica 1 restarted after every session's first turn (a rolling restart), alone
    restart_kvstore   the same, sharing one fresh daemon

Every figure is a ratio to its peer in the same invocation (COMPARISONS), with the machine's load average beside
it. A full invocation makes every run twice, the second time in the other order (ORDERS), and reports the means and
each order's ratios; it serves a Llama-3.2-1B-shaped model (bf16), --quick the small one, one order. The single-
replica runs also run `vllm bench serve` on its prefix-repetition dataset under --quick (the full run skips it to
fit ~20 minutes: a full run took 20 minutes on a quiet 2-core CPU). Model: bench.serving_model (dummy weights). Needs the integration environment
(scripts/integration_env.sh). KVSTORE_BENCH_SERVING_CHUNK=64 sets kvstore's chunk (256 tokens by default; a
multiple of vLLM's 32-token block); KVSTORE_BENCH_SERVING_GROUPS and KVSTORE_BENCH_SERVING_KEEP as below.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.bench_serve import PrefixRepetition
from bench.common import Record, print_records, record
from bench.serving_model import write_model
from bench.serving_plot import plot_runs
from bench.serving_runs import Setup, kvstore_runs, one_replica, replicas, same_memory, start_daemon
from bench.serving_sizes import BLOCK, CHUNK, POOL_SHARE, model_for, pool_blocks, pools, workload_for
from kvstore.errors import ConfigError

KEEP_ENV = "KVSTORE_BENCH_SERVING_KEEP"
GROUPS_ENV = "KVSTORE_BENCH_SERVING_GROUPS"  # e.g. "replicas,restart": only those groups' runs
CHUNK_ENV = "KVSTORE_BENCH_SERVING_CHUNK"  # kvstore's chunk in tokens (a multiple of vLLM's block); default CHUNK
PER_ORDER = ("ttft_mean", "ttft_later_turns", "tpot_mean", "load_avg_1m")  # also recorded for each order
HEADLINE = ("ttft_mean", "tpot_mean", "throughput", "failed")
BASELINE, KVSTORE = "vllm", "kvstore"
ORDERS = ((BASELINE, KVSTORE), (KVSTORE, BASELINE))  # on a shared machine the load drifts: both orders, means
GROUPS = ("single", "replicas", "restart")
# (run, peer): records serving.<run>.<figure> with the peer's figure beside it (every figure of the run)
COMPARISONS = (("kvstore_cold", "vllm"), ("kvstore_host", "vllm"), ("kvstore_nvme", "vllm"),
               ("vllm_same_memory", "vllm"), ("replicas_kvstore", "replicas_vllm"), ("restart_kvstore", "restart_vllm"))
# (run, peer): records serving.<run>.vs_<peer>.<figure>, the HEADLINE figures: kvstore against equal memory
EQUAL_MEMORY = (("kvstore_cold", "vllm_same_memory"), ("kvstore_host", "vllm_same_memory"))
Figures = dict[str, float]
Side = Callable[[Setup, Path], dict[str, Figures]]


def run(quick: bool = False, plot: Path | None = None, workload: str = "mooncake") -> list[Record]:
    """The invocation; with KVSTORE_BENCH_SERVING_KEEP=DIR its work (vLLM's and the daemon's logs) stays in DIR.
    `plot`: where to draw the chart of the runs (`--plot PATH`); `workload`: "mooncake" or "qa" (`--workload`)."""
    groups = _groups()
    keep = os.environ.get(KEEP_ENV)
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="kvbench-serving-"))
    try:
        return _measure(_setup(work, quick, workload), work, groups, quick, plot)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)


def _groups() -> tuple[str, ...]:
    names = tuple(g for g in os.environ.get(GROUPS_ENV, ",".join(GROUPS)).split(",") if g)
    if not names or set(names) - set(GROUPS):
        raise ConfigError(f"{GROUPS_ENV}={os.environ.get(GROUPS_ENV)!r}: use a comma list of {', '.join(GROUPS)}")
    return names


def _setup(work: Path, quick: bool, workload_name: str) -> Setup:
    workload, model = workload_for(quick, workload_name), model_for(quick)
    prefixes = (PrefixRepetition.covering(POOL_SHARE * pool_blocks(workload) * BLOCK, prefix_tokens=512)
                if quick else None)
    chunk = os.environ.get(CHUNK_ENV, str(CHUNK))
    if not chunk.isdigit():
        raise ConfigError(f"{CHUNK_ENV}={chunk!r}: give kvstore's chunk in tokens, a multiple of {BLOCK}")
    return Setup(write_model(work / "model", model), model, workload,
                 pools(workload, prefixes.total_tokens if prefixes else 0, int(chunk)), prefixes, workload_name)


def _sides(group: str) -> dict[str, Side]:
    """The group's vLLM-alone side and its kvstore side, each a function of (setup, work dir) to its runs."""
    if group == "single":
        return {BASELINE: lambda s, w: {"vllm": one_replica(s, None, w / "vllm"),
                                        "vllm_same_memory": same_memory(s, w / "vllm_same_memory")},
                KVSTORE: kvstore_runs}
    restart = group == "restart"
    return {BASELINE: lambda s, w: {f"{group}_vllm": replicas(s, None, w, restart=restart)},
            KVSTORE: lambda s, w: {f"{group}_kvstore": _with_daemon(s, w, restart)}}


def _with_daemon(setup: Setup, work: Path, restart: bool) -> Figures:
    daemon = start_daemon(setup, work / "daemon")
    try:
        return replicas(setup, daemon, work, restart=restart)
    finally:
        daemon.close()


def _measure(setup: Setup, work: Path, groups: tuple[str, ...], quick: bool, plot: Path | None) -> list[Record]:
    per_run: dict[str, list[Figures]] = {}
    for repeat, order in enumerate(ORDERS[:1 if quick else len(ORDERS)]):
        for group in groups:
            for side in order:
                for name, figures in _sides(group)[side](setup, work / f"{group}-{side}-{repeat}").items():
                    per_run.setdefault(name, []).append(figures)
    results = {name: _mean(figures) for name, figures in per_run.items()}
    records = _records(setup, results) + _order_records(per_run)
    title = _title(setup, len(ORDERS[:1 if quick else len(ORDERS)]))
    print_records(title, records)
    if plot is not None:
        plot_runs(results, list(results), plot, title)
    return records


def _mean(runs: list[Figures]) -> Figures:
    return {metric: statistics.fmean(run[metric] for run in runs) for metric in runs[0]}


def _records(setup: Setup, results: dict[str, Figures]) -> list[Record]:
    pool_tokens = setup.pools.num_blocks * BLOCK
    records = [record("serving.sessions_kv", setup.workload.total_kv_tokens, "tokens", "vLLM's KV pool", pool_tokens),
               record("serving.same_memory_pool", setup.pools.same_memory_blocks * BLOCK, "tokens", "vLLM's KV pool",
                      pool_tokens)]
    if setup.prefix_repetition is not None:
        records.append(record("serving.bench_serve_prefixes_kv", setup.prefix_repetition.total_tokens, "tokens",
                              "vLLM's KV pool", pool_tokens))
    for name, peer in COMPARISONS:
        if name in results and peer in results:
            records += [record(f"serving.{name}.{metric}", value, _unit(metric), peer, results[peer].get(metric, float("nan")))
                        for metric, value in results[name].items() if metric != "prompt_tokens"]
    for name, peer in EQUAL_MEMORY:
        if name in results and peer in results:
            records += [record(f"serving.{name}.vs_{peer}.{metric}", results[name][metric], _unit(metric), peer,
                               results[peer][metric]) for metric in HEADLINE]
    return records


def _order_records(per_run: dict[str, list[Figures]]) -> list[Record]:
    """Each order's own figures (the means hide which order a run went well in), against that order's peer."""
    records = []
    for name, peer in COMPARISONS:
        for repeat, (figures, base) in enumerate(zip(per_run.get(name, []), per_run.get(peer, []), strict=False)):
            records += [record(f"serving.{name}.order{repeat + 1}.{metric}", figures[metric], _unit(metric),
                               f"{peer}, order {repeat + 1}", base[metric]) for metric in PER_ORDER]
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
    w, m, p = setup.workload, setup.model, setup.pools
    timing = f"LMCache multi-round QA at {w.qps:g} req/s" if w.qps is not None else "Mooncake trace times"
    return (f"kvstore bench serving ({repeats} x each run, means; workload {setup.workload_name}: {timing}): "
            f"{w.num_sessions} sessions x {w.num_turns} turns ({w.system_tokens}-token system prompt, "
            f"{w.context_tokens}-token context, {w.message_tokens}-token messages, {w.answer_tokens}-token answers); "
            f"model {m.name} ({m.dtype}, {m.prefill_flops_per_kv_byte:,.0f} FLOP per KV byte); vLLM pool "
            f"{p.num_blocks} blocks of {BLOCK} ({p.num_blocks * BLOCK / w.longest_prompt_tokens:.1f} longest prompts), "
            f"same-memory pool {p.same_memory_blocks} blocks; chunk {p.chunk_tokens}; CPU")
