"""The CLI says where data is: `kvstore stats` lists the places (or asks a daemon with --url), `kvstore store-demo` says where it
left its chunks and how to remove them, the engine demo keeps the daemon log it printed; a store
folder held by a running daemon is refused by `kvstore stats` naming the daemon's PID."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from rich.console import Console

from service.process import CLI, write_config
from tests.helpers.forkserver import ForkServer
from tests.service.conftest import LAYOUT, start_daemon


def _kvstore(server: ForkServer, *args: str, root: Path) -> subprocess.CompletedProcess[str]:
    """`kvstore ARGS...` in a process of its own (through the fork server)."""
    env = {**os.environ, "KVSTORE_CACHE_DIR": str(root / "cache"), "COLUMNS": "200"}
    return server.run([*CLI, *args], env=env)


def test_stats_lists_where_the_store_writes_and_refuses_a_folder_in_use(tmp_path: Path, fork_server: ForkServer) -> None:
    """Plain `kvstore stats` on a folder a daemon holds says so with the --url fix; --url asks the daemon."""
    config = write_config(tmp_path, layout=LAYOUT)
    done = _kvstore(fork_server, "stats", "--config", str(config), root=tmp_path)
    assert done.returncode == 0, done.stderr
    where = json.loads(done.stdout)["where"]
    assert any(line.startswith(f"data nvme: {tmp_path / 'nvme'}") and ".kvstore.lock" in line for line in where)
    daemon = start_daemon(tmp_path)  # same config, same folder
    try:
        refused = _kvstore(fork_server, "stats", "--config", str(config), root=tmp_path)
        assert refused.returncode == 2 and f"PID {daemon.proc.pid}" in refused.stderr, refused.stderr  # type: ignore[union-attr]
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
        assert "kvstore stats --url http://127.0.0.1:" in refused.stderr  # the fix, in the same line
        asked = _kvstore(fork_server, "stats", "--url", daemon.url, root=tmp_path)
        assert asked.returncode == 0, asked.stderr
        answer = json.loads(asked.stdout)
        assert set(answer["tiers"]) == {"host", "nvme"} and answer["chunks"] == 0
        assert answer["tiers"]["host"]["capacity_bytes"] == 16 * LAYOUT.chunk_bytes
    finally:
        assert daemon.stop() == 0
    gone = _kvstore(fork_server, "stats", "--url", daemon.url, root=tmp_path)
    assert gone.returncode == 2 and len(gone.stderr.strip().splitlines()) == 1, gone.stderr
    assert f"no kvstore daemon answers at {daemon.url}" in gone.stderr and "Traceback" not in gone.stderr


def test_store_demo_says_where_it_left_data_and_how_to_remove_it(tmp_path: Path, fork_server: ForkServer) -> None:
    config = write_config(tmp_path, layout=LAYOUT)
    done = _kvstore(fork_server, "store-demo", "--config", str(config), "--prompt-tokens", str(4 * LAYOUT.chunk_tokens),
                    root=tmp_path)
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert f"data left in {tmp_path / 'nvme'}" in text and f"rm -rf {tmp_path / 'nvme'}" in text
    assert any((tmp_path / "nvme").rglob("*.kvc"))  # what it says is there is there


def test_engine_demo_keeps_the_daemon_log_it_printed(tmp_path: Path) -> None:
    from kvstore.cli.demo_run import CHUNK_TOKENS, DEMO_MODEL, _open_store

    console = Console(record=True, width=400)
    with _open_store(DEMO_MODEL.kv_layout(CHUNK_TOKENS), tmp_path, True, console) as client:
        assert client.lookup(list(range(CHUNK_TOKENS))) == 0
    printed = console.export_text()
    log = Path(printed.split("(log ")[1].split(")")[0])
    try:
        assert log.exists() and log.parent != tmp_path and f"its log is kept: {log}" in printed
        assert "ready at" in log.read_text()
    finally:
        log.unlink(missing_ok=True)
