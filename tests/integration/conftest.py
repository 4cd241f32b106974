"""Fixtures for the integration suite: real engines (vLLM, LMCache, SGLang) against a real `kvstore serve`.

Everything here runs in the integration environment (scripts/integration_env.sh); each test module
skips with a reason when its engine is not importable, and the main suite deselects the marker.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from xdist.remote import Producer

from bench.vllm_engine import ENGINE_ENV
from bench.vllm_server import Launcher, VLLMServer, serve_environment
from connector.vllm.scope import vllm_identity
from kvstore.kv_scope import KeyScope, ModelIdentity
from kvstore.layout import KVLayout
from service.process import ChildProcess, Daemon, write_config
from tests.helpers.forkserver import ForkServer
from tests.helpers.spawn_server import SpawnServer
from tests.integration.engine_spawns import SPAWN_PRELOAD, spawned_environment
from tests.integration.scheduling import IntegrationScheduling, module_rank

ROOT = Path(__file__).resolve().parents[2]


def tiny_llama(path: Path, *, num_layers: int = 2, num_kv_heads: int = 2, head_dim: int = 32,
               weights: bool = False, seed: int = 0) -> Path:
    """A tiny Llama config.json. vLLM's load_format="dummy" fills weights in [-1e-3, 1e-3], which leaves attention
    uniform and the output blind to the context; with `weights`, a seeded checkpoint (transformers' init at
    initializer_range 0.2, from `seed`) is written beside it, so the answer depends on the KV of the prefix;
    two seeds are two fine-tunes of one architecture: same KV layout, different weights."""
    path.mkdir(parents=True, exist_ok=True)
    num_heads = 4
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": num_heads * head_dim,
              "intermediate_size": 256, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
              "num_key_value_heads": num_kv_heads, "head_dim": head_dim, "vocab_size": 1024,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32",
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    (path / "config.json").write_text(json.dumps(config))
    if weights:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**{**config, "initializer_range": 0.2}))  # type: ignore[arg-type]
        model.save_pretrained(path, safe_serialization=True)
    return path


def llama_layout(chunk_tokens: int, **dims: int) -> KVLayout:
    return KVLayout(num_layers=dims.get("num_layers", 2), num_kv_heads=dims.get("num_kv_heads", 2),
                    head_dim=dims.get("head_dim", 32), dtype="float32", chunk_tokens=chunk_tokens)


def graft_prefix(url: str, scope: KeyScope, target: list[int], donor: list[int]) -> None:
    """Store `donor`'s chunks under `target`'s keys: a run that then answers as for the donor's prefix proves
    the engine used the loaded KV (and did not recompute it)."""
    import torch

    from connector.client import KVStoreClient

    with KVStoreClient(url) as client:
        target_keys, donor_keys = client.chunk_keys(target, scope), client.chunk_keys(donor, scope)
        chunks = [torch.empty(client.layout.chunk_shape, dtype=client.layout.torch_dtype) for _ in donor_keys]
        assert all(client.get_many(donor_keys, chunks))
        for key in target_keys:
            client.remove(key)
        assert client.put_many(target_keys, chunks).ok


def connector_identity(model_dir: str, layout: KVLayout, block_size: int) -> ModelIdentity:
    """The identity the vLLM connector gives `model_dir` on this machine (its CPU attention ISA's tag included)."""
    from connector.vllm.vllm_connector import cpu_attn_isa  # imports vllm: only where a test asks

    isa = cpu_attn_isa(layout.torch_dtype, block_size, layout.head_dim)
    return vllm_identity(model_dir, layout, cpu_isa=isa)


def start_daemon(root: Path, layout: KVLayout, *, host_chunks: int = 64, nvme_chunks: int = 256,
                 start_timeout_s: float = 60.0, any_layout: bool = False) -> Daemon:
    """A daemon whose tiers hold `host_chunks` and `nvme_chunks` chunks of `layout`, which is its one layout, or
    with `any_layout` only the sizing unit (no [layout]: it serves every model whose connector registers)."""
    root.mkdir(parents=True, exist_ok=True)
    config = write_config(root, layout=layout, host_chunks=host_chunks, nvme_chunks=nvme_chunks, any_layout=any_layout)
    daemon = Daemon(config, root / "daemon.log")
    try:
        return daemon.start(timeout_s=start_timeout_s)
    except RuntimeError:
        daemon.close()  # not ready in time: no daemon left behind
        raise


@pytest.fixture(autouse=True)
def no_shared_prometheus_dir() -> Iterator[None]:
    """LMCache's in-process engine sets PROMETHEUS_MULTIPROC_DIR (/tmp/lmcache_prometheus, never wiped) in this
    process; every engine started after it would inherit it and report the sums of all servers that ever
    wrote there. Each test leaves the environment as it found it."""
    before = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    yield
    if before is None:
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    else:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = before


@pytest.fixture
def daemon_factory(tmp_path: Path) -> Iterator[Any]:
    started: list[Daemon] = []

    def make(layout: KVLayout, name: str = "daemon", **kw: Any) -> Daemon:
        daemon = start_daemon(tmp_path / name, layout, **kw)
        started.append(daemon)
        return daemon

    yield make
    for daemon in started:
        daemon.close()


# What bench.vllm_engine imports of vLLM: the engine fork server imports it once, a fork per engine.
VLLM_PRELOAD = ("vllm.entrypoints.llm", "vllm.config", "vllm.sampling_params", "vllm.distributed.kv_transfer")
_engine_servers: list[ForkServer] = []  # the session's engine fork server (vllm_engine_server), while it runs


def engine_env() -> dict[str, str]:
    """An engine process's environment: this one's, the repo importable, no shared Prometheus directory."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    return env


@pytest.fixture(scope="session", autouse=True)
def vllm_engine_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    """Engines (run_vllm) forked from one process that imported vLLM under bench.vllm_engine's settings: each
    engine's first half-minute of CPU, importing vLLM, is spent once per session instead. The server starts on the
    first engine (a worker that runs none never imports vLLM); each child is still a new process that builds its
    own engine from nothing. KVSTORE_TEST_COLD_STARTS=1 starts each engine in a fresh interpreter instead."""
    cold = os.environ.get("KVSTORE_TEST_COLD_STARTS", "") not in ("", "0")
    server = ForkServer(tmp_path_factory.mktemp("vllm_forkserver") / "forkserver.log", enabled=not cold,
                        preload=VLLM_PRELOAD, env={**engine_env(), **ENGINE_ENV}, start_timeout_s=900.0)
    _engine_servers.append(server)
    yield server
    _engine_servers.remove(server)
    server.close()


# What a `vllm serve` API server imports: its fork server imports it once.
SERVE_PRELOAD = ("vllm.entrypoints.launchers.api_server.entry", "vllm.v1.engine.async_llm", "uvloop")


@pytest.fixture(scope="session")
def serve_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    """Starts `vllm serve` API servers (VLLMServer's launcher) forked from one process that imported vLLM's API
    server, and their engine core and worker, which vLLM spawns on CPU, forked from a spawn server that imported
    theirs (tests/helpers/spawn_server.py): each server's three imports of vLLM are spent once per session instead.
    Each API server is a session leader as with Popen, so VLLMServer.stop ends its whole group (the engine
    processes' trampolines, which live and die with them, among it). KVSTORE_TEST_COLD_STARTS=1 starts each in a
    fresh interpreter, and its children with plain spawn, instead."""
    cold = os.environ.get("KVSTORE_TEST_COLD_STARTS", "") not in ("", "0")
    server = ForkServer(tmp_path_factory.mktemp("serve_forkserver") / "forkserver.log", enabled=not cold,
                        preload=SERVE_PRELOAD, env=serve_environment(), start_timeout_s=900.0)
    spawner = SpawnServer(Path(tempfile.mkdtemp(prefix="kvstore-spawn-")),
                          tmp_path_factory.mktemp("spawn_server") / "spawn_server.log", preload=SPAWN_PRELOAD,
                          env=spawned_environment(serve_environment()), enabled=not cold)

    def launch(argv: list[str], env: dict[str, str], log: Path) -> ChildProcess:
        if spawner.executable is not None:
            argv = ["-m", "tests.helpers.preloaded_spawn", str(spawner.executable), *argv]
        return server.spawn(argv, env=env, stdout=log, cwd=ROOT, new_session=True)

    server.start()
    spawner.start()
    yield launch
    server.close()
    spawner.close()
    shutil.rmtree(spawner.folder, ignore_errors=True)


def run_vllm(spec: dict[str, Any], work: Path, *, timeout_s: float = 900, wait: bool = True) -> Any:
    """Run bench/vllm_engine.py on `spec` in a child process; returns its report (or the process when wait=False)."""
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = work / "spec.json", work / "out.json"
    spec_path.write_text(json.dumps(spec))
    argv, log = ["-m", "bench.vllm_engine", str(spec_path), str(out_path)], work / "vllm.log"
    if _engine_servers:
        proc: ChildProcess = _engine_servers[-1].spawn(argv, env=engine_env(), stdout=log, cwd=ROOT, append=False)
    else:
        with log.open("wb") as out:
            proc = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=engine_env(), stdout=out,
                                    stderr=subprocess.STDOUT)
    if not wait:
        return proc
    return finish_vllm(proc, work, timeout_s)


def finish_vllm(proc: ChildProcess, work: Path, timeout_s: float = 900) -> Any:
    code = proc.wait(timeout=timeout_s)
    log = (work / "vllm.log").read_text(errors="replace")
    assert code == 0, f"vLLM run failed ({code}):\n{log[-6000:]}"
    report = json.loads((work / "out.json").read_text())
    report["log"] = log
    return report


def run_vllm_together(specs: dict[str, dict[str, Any]], root: Path, timeout_s: float = 900) -> dict[str, Any]:
    """Run each spec in its own engine process (work dir root / name), all side by side: each process spends its
    first minute importing vLLM and loading the model. Their reports by name; any failure ends the others."""
    running = {name: run_vllm(spec, root / name, wait=False) for name, spec in specs.items()}
    try:
        return {name: finish_vllm(proc, root / name, timeout_s) for name, proc in running.items()}
    finally:
        for proc in running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def start_servers(*servers: VLLMServer) -> tuple[VLLMServer, ...]:
    """Start the `vllm serve` servers side by side (each start imports vLLM and loads the model: a minute here);
    if one fails, all are stopped and its error raised."""
    with ThreadPoolExecutor(len(servers)) as pool:
        started = [pool.submit(server.start) for server in servers]
        try:
            for future in started:
                future.result()
        except BaseException:
            for future in started:
                future.exception()  # wait for every start to end before stopping them all
            for server in servers:
                server.stop()
            raise
    return servers


ENGINE_TIMEOUT_S = 1800  # an engine start alone can take minutes on a loaded CPU machine; pyproject's 60 s is the main suite's


@pytest.hookimpl(trylast=True)  # after tests/conftest.py's LONG_FILES order: this one decides for the engine tests
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Integration tests without a timeout mark of their own get ENGINE_TIMEOUT_S instead of the default; the
    integration tests go in LONG_MODULES' order (a stable sort: each module's tests in their own order)."""
    for item in items:
        if item.get_closest_marker("integration") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(ENGINE_TIMEOUT_S))
    items.sort(key=lambda item: module_rank(item.nodeid) if item.get_closest_marker("integration") else -1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Producer) -> IntegrationScheduling | None:
    """--dist loadfile in a run that collects tests/integration: README blocks shared out one by one."""
    return IntegrationScheduling(config, log) if config.getvalue("dist") == "loadfile" else None


_EXIT_STATUS: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An integration run leaves without the interpreter's teardown, once every result and the summary are out.

    The engines' libraries imported into this process (vLLM, SGLang, LMCache, and the native thread pools they
    start) can abort the interpreter while it tears down: a run in which all 27 integration tests passed then died
    with "terminate called without an active exception" (exit 134). Nothing is left to report at this point, so the
    run exits with pytest's own status instead of that teardown's. Only for `-m integration` runs."""
    if _EXIT_STATUS and "integration" in str(config.option.markexpr) and "not integration" not in str(config.option.markexpr):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_EXIT_STATUS[-1])
