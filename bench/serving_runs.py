"""The runs of `kvstore bench serving`, each on fresh `vllm serve` processes: one replica (vLLM alone, with its
pool enlarged by kvstore's host-tier bytes, or beside a daemon), two replicas behind bench.serving_router (alone
or sharing one daemon), and two replicas of which one is restarted between the sessions' first turns and their later ones. Each returns its figures."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.bench_serve import PrefixRepetition, bench_serve
from bench.proc_cpu import cpu_seconds
from bench.serving_client import drive
from bench.serving_model import ModelShape
from bench.serving_phases import first_turns, joined, later_turns
from bench.serving_router import ReplicaSet, Router
from bench.serving_sizes import BLOCK, Pools
from bench.serving_workload import Workload, make_sessions
from bench.vllm_server import ServeSpec, VLLMServer, live_group_members
from kvstore.layout import KVLayout
from service.process import Daemon, write_config

DAEMON_START_S = 300  # imports alone take a minute on a loaded 2-core machine
SERVER_START_S = 900
RESTART_AFTER_TURNS = 1  # the rolling restart comes after every session's first turn
ROUTER_POLICY = "round_robin"


@dataclass(frozen=True, slots=True)
class Setup:
    """What every run of one invocation shares. `prefix_repetition`: None skips `vllm bench serve`."""

    model_dir: Path
    model: ModelShape
    workload: Workload
    pools: Pools
    prefix_repetition: PrefixRepetition | None
    workload_name: str = "mooncake"


def serve_spec(setup: Setup, daemon: Daemon | None, *, num_blocks: int | None = None,
               omp_threads: int | None = None) -> ServeSpec:
    """One server of the run: vLLM's pool of `num_blocks` (the small pool unless given), kvstore's connector
    to `daemon` if any. vLLM checks max_model_len against the memory before it applies num_blocks: twice the
    pool's bytes."""
    blocks = num_blocks or setup.pools.num_blocks
    connector = {"url": daemon.url, "chunk_tokens": setup.pools.chunk_tokens} if daemon is not None else None
    return ServeSpec(model_dir=setup.model_dir, block_size=BLOCK, prefix_caching=True, connector=connector,
                     dtype=setup.model.dtype, num_blocks=blocks,
                     kv_cache_bytes=2 * blocks * BLOCK * setup.model.kv_bytes_per_token,
                     max_model_len=setup.pools.max_model_len, omp_threads=omp_threads)


def start_daemon(setup: Setup, work: Path) -> Daemon:
    """A fresh daemon whose host tier (and NVMe tier) holds setup.pools.host_chunks chunks of the model's KV."""
    m = setup.model
    layout = KVLayout(num_layers=m.num_hidden_layers, num_kv_heads=m.num_key_value_heads, head_dim=m.head_dim,
                      dtype=m.dtype, chunk_tokens=setup.pools.chunk_tokens)
    work.mkdir(parents=True)
    config = write_config(work, layout=layout, host_chunks=setup.pools.host_chunks,
                          nvme_chunks=setup.pools.host_chunks)
    return Daemon(config, work / "daemon.log").start(timeout_s=DAEMON_START_S)


def kvstore_runs(setup: Setup, work: Path) -> dict[str, dict[str, float]]:
    """A fresh daemon, three fresh vLLM servers: cold (the daemon starts empty: first turns are computed as with
    vLLM alone), host (the same sessions again, every chunk in the daemon's host tier, as for a restarted or
    second engine beside a running daemon), then NVMe after a daemon restart (the host tier is memory)."""
    daemon = start_daemon(setup, work / "daemon")
    try:
        cold = one_replica(setup, daemon, work / "kvstore_cold")
        host = one_replica(setup, daemon, work / "kvstore_host")
        daemon.stop()
        daemon.start(timeout_s=DAEMON_START_S)
        return {"kvstore_cold": cold, "kvstore_host": host, "kvstore_nvme": one_replica(setup, daemon, work / "kvstore_nvme")}
    finally:
        daemon.close()


def one_replica(setup: Setup, daemon: Daemon | None, work: Path, num_blocks: int | None = None) -> dict[str, float]:
    """One fresh `vllm serve`: the sessions, then `vllm bench serve` (if the setup has it); the figures of both."""
    spec = serve_spec(setup, daemon, num_blocks=num_blocks)
    load_avg = os.getloadavg()[0]
    with VLLMServer(spec, work / "vllm.log").start(timeout_s=SERVER_START_S) as server:
        assert server.proc is not None
        daemon_pids = [daemon.proc.pid] if daemon is not None and daemon.proc is not None else []
        cpu_before = (cpu_seconds(live_group_members(server.proc.pid)), cpu_seconds(daemon_pids))
        before = vllm_counts(server)
        figures = drive(server.url, make_sessions(setup.workload), setup.workload.answer_tokens).summary()
        figures.update(vllm_figures(before, vllm_counts(server)))
        if setup.prefix_repetition is not None:
            figures.update({f"bench_serve.{k}": v for k, v in
                            bench_serve(server, setup.model_dir, setup.prefix_repetition, work).items()})
        figures["vllm_cpu_s"] = cpu_seconds(live_group_members(server.proc.pid)) - cpu_before[0]
        figures["daemon_cpu_s"] = cpu_seconds(daemon_pids) - cpu_before[1]
    figures["load_avg_1m"] = (load_avg + os.getloadavg()[0]) / 2  # a shared machine: how busy it was meanwhile
    return figures


def same_memory(setup: Setup, work: Path) -> dict[str, float]:
    """vLLM alone with its pool enlarged by the bytes of kvstore's host tier (same dtype, same RAM on a CPU)."""
    return one_replica(setup, None, work, num_blocks=setup.pools.same_memory_blocks)


def replicas(setup: Setup, daemon: Daemon | None, work: Path, *, restart: bool = False) -> dict[str, float]:
    """Two fresh replicas (one OpenMP thread each: two cores) behind a round-robin router, sharing `daemon` if
    any. With `restart`, a rolling restart of replica 1 between every session's first RESTART_AFTER_TURNS turns
    and its later ones (bench.serving_phases): drained, stopped, a fresh server in its place; the sessions' later
    turns keep their relative times, shifted past the restart, whose time is not in any TTFT."""
    spec = serve_spec(setup, daemon, omp_threads=1)
    servers = [VLLMServer(spec, work / f"replica{i}.log") for i in range(2)]
    sessions, answer_tokens = make_sessions(setup.workload), setup.workload.answer_tokens
    load_avg = os.getloadavg()[0]
    try:
        with ThreadPoolExecutor(2) as pool:  # start both at once: each start is mostly one core's imports
            list(pool.map(lambda s: s.start(timeout_s=SERVER_START_S), servers))
        replica_set = ReplicaSet([s.url for s in servers], policy=ROUTER_POLICY)
        with Router(replica_set).start() as router:
            if not restart:
                figures = drive(router.url, sessions, answer_tokens).summary()
            else:
                first = drive(router.url, first_turns(sessions, RESTART_AFTER_TURNS), answer_tokens)
                later, dropped = later_turns(sessions, first, RESTART_AFTER_TURNS)
                restart_s = restart_replica(replica_set, servers, 1, work / "replica1-restarted.log")
                served_before = replica_set.num_served[servers[1].url]
                second = drive(router.url, later, answer_tokens) if later else None
                figures = joined(first, second, RESTART_AFTER_TURNS, dropped).summary()
                figures.update({"restart_s": restart_s,
                                "restarted_requests": float(replica_set.num_served[servers[1].url] - served_before)})
    finally:
        for server in servers:
            server.stop()
    figures["load_avg_1m"] = (load_avg + os.getloadavg()[0]) / 2
    return figures


def restart_replica(replica_set: ReplicaSet, servers: list[VLLMServer], index: int, log: Path) -> float:
    """Drain servers[index] (nothing new; those in flight finish), stop it, start a fresh server with its spec in
    its place (servers[index] and the router's rotation); the seconds that took."""
    start = time.perf_counter()
    old = servers[index]
    replica_set.drain(old.url)
    replica_set.wait_drained(old.url, timeout_s=SERVER_START_S)
    old.stop()
    successor = VLLMServer(old.spec, log)
    servers[index] = successor  # stopped with the others, whatever happens
    successor.start(timeout_s=SERVER_START_S)
    replica_set.replace(old.url, successor.url)
    return time.perf_counter() - start


_VLLM_COUNTS = ("vllm:external_prefix_cache_hits_total", "vllm:request_queue_time_seconds_sum",
                "vllm:request_prefill_time_seconds_sum", "vllm:request_queue_time_seconds_count",
                "vllm:kvstore_step_loads_total", "vllm:kvstore_background_loads_total",
                "vllm:kvstore_finish_waits_total", "vllm:kvstore_finish_wait_hits_total")


def vllm_counts(server: VLLMServer) -> dict[str, float]:
    return {name: server.metric_total(name) for name in _VLLM_COUNTS}


def vllm_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
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
