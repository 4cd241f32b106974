"""Start-up of a real `kvstore serve`: every config error is one line and exit 2 with nothing left
behind, a host tier larger than this machine's free RAM is refused before allocation, a second
daemon on the same NVMe directory or port refuses cleanly, "ready" comes only after binding, and
the daemon says where it writes."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connector.client import KVStoreClient
from kvstore.preflight import MachineMemory
from service.process import CLI, Daemon, free_port, write_config
from tests.helpers.forkserver import ForkServer
from tests.service.conftest import LAYOUT, start_daemon


def _serve(fork_server: ForkServer, config: Path, *args: str, root: Path,
           timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """`kvstore serve` to its end, forked from the session's fork server (torch already imported)."""
    env = {**os.environ, "KVSTORE_CACHE_DIR": str(root / "cache")}
    return fork_server.run([*CLI, "serve", "--config", str(config), *args, "--log-level", "warning"], env=env,
                           timeout_s=timeout_s)


def _config(root: Path, *, edit: tuple[str, str] | None = None, append: str = "", **kwargs: Any) -> Path:
    path = write_config(root, layout=LAYOUT, **kwargs)
    text = path.read_text()
    if edit is not None:
        assert edit[0] in text
        text = text.replace(edit[0], edit[1], 1)
    text = text.replace("[service]", append + "[service]", 1) if append else text
    path.write_text(text)
    return path


def _shm_name() -> str:
    return f"kvstore-test-{uuid.uuid4().hex[:10]}"


def _nvme_line(path: str) -> str:
    return f'path = "{path}"'


MEM_AVAILABLE = MachineMemory.read().available_bytes
CASES = {
    "eviction": dict(edit=('kind = "nvme"', 'kind = "nvme"\neviction = "LRU"'),
                     expect=["tier nvme", "eviction", "'LRU'", "lru"]),
    "replay_only_eviction": dict(edit=('kind = "nvme"', 'kind = "nvme"\neviction = "pace"'),
                                 expect=["tier nvme", "'pace'", "replay-only", "kvstore replay", "adaptive, arc, lfu"]),
    "codec": dict(edit=('kind = "nvme"', 'kind = "nvme"\ncodec = "brotli"'), expect=["tier nvme", "codec", "'brotli'", "lz4"]),
    "kind": dict(edit=('kind = "nvme"', 'kind = "floppy"'), expect=["kind", "'floppy'", "nvme"]),
    "option": dict(edit=('kind = "host"', 'kind = "host"\noptions = { shm_nam = "x" }'),
                   expect=["tier host", "options.shm_nam", "shm_name"]),
    "compression": dict(edit=('put_timeout_s = 3.0', 'put_timeout_s = 3.0\ncompression = "zip"'),
                        expect=["compression", "'zip'", "static"]),
    "under_a_file": dict(nvme="afile/nvme", expect=["tier nvme", "afile", "is a file"]),
    "missing_folder": dict(nvme="missing/deeper/nvme", expect=["tier nvme", "missing/deeper", "does not exist", "mkdir -p"]),
    "uds_folder": dict(args=["--uds", "{root}/nope/kv.sock"], expect=["--uds", "nope", "does not exist", "mkdir -p"]),
    "memory": dict(edit=(f"capacity = '{16 * LAYOUT.chunk_bytes}B'\n", f"capacity = '{MEM_AVAILABLE + (8 << 30)}B'\n"),
                   expect=["tier host", "capacity", "MemAvailable", "lower capacity to at most"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_error_is_one_line_exit_2_and_nothing_left(tmp_path: Path, case: Any, fork_server: ForkServer) -> None:
    spec = CASES[case]
    (tmp_path / "afile").write_text("not a folder")
    config = _config(tmp_path, edit=spec.get("edit"))  # type: ignore[attr-defined]
    if "nvme" in spec:  # type: ignore[operator]
        config.write_text(config.read_text().replace(_nvme_line(str(tmp_path / "nvme")),
                                                      _nvme_line(str(tmp_path / spec["nvme"]))))  # type: ignore[index]
    before = sorted(p.name for p in tmp_path.iterdir())
    args = [a.format(root=tmp_path) for a in spec.get("args", ["--port", str(free_port())])]  # type: ignore[attr-defined]
    done = _serve(fork_server, config, *args, root=tmp_path)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("kvstore serve: "), done.stderr
    assert "Traceback" not in done.stderr + done.stdout and "ready at" not in done.stderr
    for fragment in spec["expect"]:  # type: ignore[index]
        assert fragment in lines[0], (fragment, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no folder, socket or cache dir created


def test_memory_check_refuses_more_than_the_machine_has_before_allocating(tmp_path: Path) -> None:
    from kvstore.config import load_config
    from kvstore.errors import ConfigError
    from kvstore.preflight import check_machine

    memory = MachineMemory.read()  # read once: other processes move MemAvailable by GiBs between two readings
    config = load_config(_config(tmp_path, edit=(f"capacity = '{16 * LAYOUT.chunk_bytes}B'\n",
                                                 f"capacity = '{memory.available_bytes + (4 << 30)}B'\n")))
    start = time.perf_counter()
    with pytest.raises(ConfigError, match="MemAvailable") as refused:
        check_machine(config, creatable_under=tmp_path, memory=memory)
    print(f"refused in {(time.perf_counter() - start) * 1e3:.1f} ms: {refused.value}")
    # A host tier that fits the machine passes the same check.
    check_machine(load_config(_config(tmp_path)), creatable_under=tmp_path)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Any]:
    """A real 64 MiB tmpfs standing in for /dev/shm (needs root, as CI has)."""
    mount = tmp_path / "shm"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_shared_memory_arena_larger_than_the_shm_room_is_refused(tmp_path: Path, small_tmpfs: Any) -> None:
    from kvstore.config import load_config
    from kvstore.errors import ConfigError
    from kvstore.preflight import check_machine

    name = _shm_name()
    config = load_config(_config(tmp_path, edit=(f"capacity = '{16 * LAYOUT.chunk_bytes}B'\n",
                                                 f'capacity = "128MiB"\noptions = {{ shm_name = "{name}" }}\n')))
    with pytest.raises(ConfigError, match=f"free room in {small_tmpfs}") as refused:
        check_machine(config, creatable_under=tmp_path, shm_dir=str(small_tmpfs), headroom_bytes=0)
    assert "64.0 MiB" in str(refused.value) and "\n" not in str(refused.value)
    fits = load_config(_config(tmp_path, edit=(f"capacity = '{16 * LAYOUT.chunk_bytes}B'\n",
                                               f'capacity = "32MiB"\noptions = {{ shm_name = "{name}" }}\n')))
    check_machine(fits, creatable_under=tmp_path, shm_dir=str(small_tmpfs), headroom_bytes=0)


def test_second_daemon_on_the_same_directory_or_port_refuses(tmp_path: Path, fork_server: ForkServer) -> None:
    (tmp_path / "a").mkdir()
    first = start_daemon(tmp_path / "a")
    try:
        log = first.log.read_text()
        assert "writes to:" in log and log.index("writes to:") < log.index("ready at")
        assert f"data nvme: {tmp_path / 'a' / 'nvme'}" in log and "shared memory: per-client memfd segments" in log
        (tmp_path / "b").mkdir()
        same_dir = _config(tmp_path / "b")
        same_dir.write_text(same_dir.read_text().replace(str(tmp_path / "b" / "nvme"), str(tmp_path / "a" / "nvme")))
        refused = _serve(fork_server, same_dir, "--port", str(free_port()), root=tmp_path / "b")
        assert refused.returncode == 2 and f"PID {first.proc.pid}" in refused.stderr, refused.stderr  # type: ignore[union-attr]
        assert "ready at" not in refused.stderr and "Traceback" not in refused.stderr
        same_port = _serve(fork_server, _config(tmp_path / "b"), "--port", str(first.port), root=tmp_path / "b")
        assert same_port.returncode == 2 and "already in use" in same_port.stderr, same_port.stderr
        assert "ready at" not in same_port.stderr and "Traceback" not in same_port.stderr
        assert not (tmp_path / "b" / "nvme").exists()  # refused before the store opened
        with first.client() as http:  # the first daemon is unharmed
            assert http.get("/healthz").status_code == 200
    finally:
        assert first.stop() == 0


def test_a_host_tier_named_into_dev_shm_and_the_arena_plane_are_refused(tmp_path: Path, fork_server: ForkServer) -> None:
    """The retired arena plane: its settings are refused in one line naming the replacement, and the
    daemon's host arena is never put in /dev/shm."""
    name = _shm_name()
    config = _config(tmp_path, edit=('kind = "host"', f'kind = "host"\noptions = {{ shm_name = "{name}" }}'))
    refused = _serve(fork_server, config, "--port", str(free_port()), root=tmp_path)
    assert refused.returncode == 2 and "options.shm_name" in refused.stderr and "Traceback" not in refused.stderr
    assert not Path("/dev/shm", name).exists()
    for setting in ({"shm_plane": "arena"}, {"max_pin_s": 2.0}):
        refused = _serve(fork_server, _config(tmp_path, service=setting), "--port", str(free_port()), root=tmp_path)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert 'the "arena" shared-memory plane is retired' in refused.stderr and '"segments"' in refused.stderr


def test_tenants_use_shared_memory_by_default_and_stats_need_a_token(tmp_path: Path) -> None:
    tenants = [{"name": "t", "token": "token-tttt-0000", "salt": "salt-t"},
               {"name": "h", "token": "token-hhhh-0000", "salt": "salt-h", "shm": False}]
    daemon = start_daemon(tmp_path, tenants=tenants)
    try:
        with KVStoreClient(daemon.url, token="token-tttt-0000") as t, KVStoreClient(daemon.url, token="token-hhhh-0000") as h:
            assert t.use_shm and not h.use_shm
        with daemon.client() as anonymous:
            assert anonymous.get("/v1/stats").status_code == 401
            assert anonymous.get("/metrics").status_code == 401  # with tenants, a metrics, admin or tenant token
    finally:
        daemon.close()


def test_docs_are_served_from_packaged_assets(daemon: Any) -> None:
    with daemon.client() as http:
        page = http.get("/docs")
        assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
        assert "cdn" not in page.text.lower() and "https://" not in page.text.split("<script>")[0]
        bundle = http.get("/docs/assets/swagger-ui-bundle.js")
        assert bundle.status_code == 200 and len(bundle.content) > 100_000 and b"SwaggerUIBundle" in bundle.content
        assert http.get("/docs/assets/swagger-ui.css").status_code == 200
        assert http.get("/redoc").status_code == 404  # FastAPI's redoc page loads from a CDN: off
        assert "/v1/lookup" in http.get("/openapi.json").json()["paths"]  # no auth configured: open like every route


def test_every_metric_family_has_help_and_type(daemon: Any) -> None:
    with daemon.client() as http:
        http.get("/healthz")
        text = http.get("/metrics").text
    helps = {line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")}
    types = {line.split()[2]: line.split()[3] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert types and set(types) == helps
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split()[0]
            family = next((f for f in types if name == f or (types[f] == "histogram" and name.startswith(f + "_"))), None)
            assert family is not None, f"sample {name} has no # TYPE / # HELP"


def test_memory_tiers_share_the_available_ram(tmp_path: Path) -> None:
    """Two memory tiers that each fit but not together are refused, naming the one that tips it over
    (without CUDA the GPU tier's arena is in RAM)."""
    import torch

    from kvstore.config import TierConfig, load_config
    from kvstore.errors import ConfigError
    from kvstore.preflight import check_memory
    from kvstore.types import TierKind

    if torch.cuda.is_available():
        pytest.skip("the GPU tier is on the device here")
    base = load_config(_config(tmp_path))
    memory = MachineMemory.read()  # one reading for both checks: other processes move MemAvailable meanwhile
    half = memory.available_bytes // 2 + (1 << 30)
    tiers = (TierConfig(kind=TierKind.GPU, capacity_bytes=half), TierConfig(kind=TierKind.HOST, capacity_bytes=half))
    with pytest.raises(ConfigError, match="tier host: .*MemAvailable\\) after the tiers above"):
        check_memory(type(base)(layout=base.layout, tiers=tiers), headroom_bytes=0, memory=memory)
    check_memory(type(base)(layout=base.layout, tiers=tiers[1:]), headroom_bytes=0, memory=memory)


def test_a_daemon_not_ready_in_time_is_stopped_before_the_error(tmp_path: Path) -> None:
    daemon = Daemon(_config(tmp_path), tmp_path / "daemon.log")
    with pytest.raises(RuntimeError, match=r"not ready in 0\.001 s \(stopped\)"):
        daemon.start(timeout_s=0.001)  # far less than any start: the wait gives up at once
    assert daemon.proc is not None and daemon.proc.poll() is not None, "no daemon is left running"
