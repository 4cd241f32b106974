"""The runs of `kvstore bench serving`, each on fresh `vllm serve` processes: one replica (vLLM alone, with its
pool enlarged by kvstore's host-tier bytes, or beside a daemon), two replicas behind bench.serving_router (alone
or sharing one daemon), and two replicas of which one is restarted mid-run. Each returns its figures."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bench.bench_serve import PrefixRepetition, bench_serve
from bench.proc_cpu import cpu_seconds
from bench.serving_client import drive
from bench.serving_model import ModelShape
from bench.serving_router import ReplicaSet, Router
from bench.serving_sizes import BLOCK, CHUNK, Pools
from bench.serving_workload import Workload, make_sessions
from bench.vllm_server import ServeSpec, VLLMServer, live_group_members
from kvstore.layout import KVLayout
from service.process import Daemon, write_config

DAEMON_START_S = 300  # imports alone take a minute on a loaded 2-core machine
SERVER_START_S = 900
RESTART_AFTER = 0.25  # the rolling restart begins once this share of the run's requests is answered
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

    @property
    def num_requests(self) -> int:
        return self.workload.num_sessions * self.workload.num_turns


def serve_spec(setup: Setup, daemon: Daemon | None, *, num_blocks: int | None = None,
               omp_threads: int | None = None) -> ServeSpec:
    """One server of the run: vLLM's pool of `num_blocks` (the small pool unless given), kvstore's connector
    to `daemon` if any. vLLM checks max_model_len against the memory before it applies num_blocks: twice the
    pool's bytes."""
    blocks = num_blocks or setup.pools.num_blocks
    connector = {"url": daemon.url, "chunk_tokens": CHUNK} if daemon is not None else None
    return ServeSpec(model_dir=setup.model_dir, block_size=BLOCK, prefix_caching=True, connector=connector,
                     dtype=setup.model.dtype, num_blocks=blocks,
                     kv_cache_bytes=2 * blocks * BLOCK * setup.model.kv_bytes_per_token,
                     max_model_len=setup.pools.max_model_len, omp_threads=omp_threads)


def start_daemon(setup: Setup, work: Path) -> Daemon:
    """A fresh daemon whose host tier (and NVMe tier) holds setup.pools.host_chunks chunks of the model's KV."""
    m = setup.model
    layout = KVLayout(num_layers=m.num_hidden_layers, num_kv_heads=m.num_key_value_heads, head_dim=m.head_dim,
                      dtype=m.dtype, chunk_tokens=CHUNK)
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
    any; with `restart`, replica 1 is restarted once RESTART_AFTER of the requests are answered."""
    spec = serve_spec(setup, daemon, omp_threads=1)
    servers = [VLLMServer(spec, work / f"replica{i}.log") for i in range(2)]
    load_avg = os.getloadavg()[0]
    try:
        with ThreadPoolExecutor(2) as pool:  # start both at once: each start is mostly one core's imports
            list(pool.map(lambda s: s.start(timeout_s=SERVER_START_S), servers))
        replica_set = ReplicaSet([s.url for s in servers], policy=ROUTER_POLICY)
        with Router(replica_set).start() as router:
            roll = RollingRestart(replica_set, servers, spec, work) if restart else None
            if roll is not None:
                roll.begin_after(int(RESTART_AFTER * setup.num_requests))
            figures = drive(router.url, make_sessions(setup.workload), setup.workload.answer_tokens).summary()
            if roll is not None:
                figures.update(roll.finish())
    finally:
        for server in servers:
            server.stop()
    figures["load_avg_1m"] = (load_avg + os.getloadavg()[0]) / 2
    return figures


class RollingRestart:
    """Replica 1's rolling restart in a thread: once `after` requests are answered, start its successor (a
    surge, as a rolling update does), drain it, swap the successor in, stop it."""

    def __init__(self, replica_set: ReplicaSet, servers: list[VLLMServer], spec: ServeSpec, work: Path) -> None:
        self.replica_set = replica_set
        self.servers = servers
        self.spec = spec
        self.work = work
        self.done = threading.Event()
        self.figures: dict[str, float] = {"restart_s": float("nan"), "restarted_requests": 0.0}
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.successor = ""

    def begin_after(self, after: int) -> None:
        self.thread = threading.Thread(target=self._run, args=(after,), daemon=True, name="rolling-restart")
        self.thread.start()

    def _run(self, after: int) -> None:
        try:
            while self.replica_set.num_done < after and not self.done.is_set():
                time.sleep(0.1)
            if self.done.is_set():
                return
            start = time.perf_counter()
            successor = VLLMServer(self.spec, self.work / "replica1-restarted.log")
            self.servers.append(successor)  # stopped with the others, whatever happens
            successor.start(timeout_s=SERVER_START_S)
            old = self.servers[1]
            self.replica_set.drain(old.url)
            self.replica_set.wait_drained(old.url, timeout_s=SERVER_START_S)
            self.replica_set.replace(old.url, successor.url)
            self.successor = successor.url
            old.stop()
            self.figures["restart_s"] = time.perf_counter() - start
        except BaseException as exc:  # re-raised in finish(), on the bench's thread
            self.error = exc

    def finish(self) -> dict[str, float]:
        """Wait for the restart (if it began), then its figures: how long it took, requests the successor took.

        Raises:
            RuntimeError: the restart failed (its cause chained).
        """
        self.done.set()
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise RuntimeError(f"the rolling restart failed: {self.error}") from self.error
        if self.successor:
            self.figures["restarted_requests"] = float(self.replica_set.num_served[self.successor])
        return self.figures


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
