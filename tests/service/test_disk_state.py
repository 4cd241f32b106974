"""The index against the disk, on a real daemon over real (tmpfs) filesystems: a full disk and a
read-only one are reported with their cause, a daemon refuses to start on a tier it cannot
write, a delete that fails keeps the index entry, and a chunk file deleted underneath is a miss
that leaves the index, and a restart on a disk another process filled comes up capped. Filesystem
cases mount tmpfs (root only); skipped with the reason otherwise."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from connector.client import KVStoreClient
from service.process import Daemon, write_config
from tests.conftest import make_chunk
from tests.service.conftest import LAYOUT, start_daemon

CHUNK = LAYOUT.chunk_bytes


def _mount(path: Path, size: str, *options: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()[:200]}); needs root in a mount namespace")


def _remount(path: Path, mode: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Any]:
    mounted: list[Path] = []

    def make(size: str, *options: str) -> Path:
        path = tmp_path / f"fs{len(mounted)}"
        _mount(path, size, *options)
        mounted.append(path)
        return path

    yield make
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _daemon_on(root: Path, nvme: Path, *, host_chunks: int = 4, nvme_chunks: int = 64) -> Daemon:
    config = write_config(root, layout=LAYOUT, host_chunks=host_chunks, nvme_chunks=nvme_chunks)
    config.write_text(config.read_text().replace(f'path = "{root / "nvme"}"', f'path = "{nvme}"'))
    return Daemon(config, root / "daemon.log")


def test_start_refuses_a_read_only_tier(tmp_path: Path, tmpfs: Any) -> None:
    nvme = tmpfs("1m", "ro")
    with pytest.raises(RuntimeError, match="read-only"):
        _daemon_on(tmp_path, nvme).start(timeout_s=30)


def test_full_disk_is_reported_with_its_cause(tmp_path: Path, tmpfs: Any) -> None:
    nvme = tmpfs("2m")  # the tier (64 chunks, about 1 MiB) fits at start: start-up refuses a tier larger than its disk
    d = _daemon_on(tmp_path, nvme).start()
    # Then another writer fills the filesystem but for about 96 KiB: room for a few 8 KiB chunk files only.
    (nvme / "filler").write_bytes(b"\0" * ((2 << 20) - (96 << 10)))
    try:
        with KVStoreClient(d.url, use_shm=False) as client:
            keys = client.chunk_keys(list(range(24 * LAYOUT.chunk_tokens)))
            reasons: dict = {}
            for i, key in enumerate(keys):
                reasons.update(client.put_many([key], [make_chunk(LAYOUT, i)]).not_replicated)
            assert reasons, "a 96 KiB filesystem took 24 chunk files"
            assert all("ENOSPC" in r for r in reasons.values()), list(reasons.values())[:2]
            stats = client.stats()
        assert stats["service"]["nvme.write_errors_ENOSPC"] >= len(reasons)
        assert stats["tiers"]["nvme"]["write_errors_ENOSPC"] >= len(reasons)
    finally:
        d.close()


def test_failed_delete_keeps_the_entry_and_its_cause(tmp_path: Path, tmpfs: Any) -> None:
    nvme = tmpfs("1m")
    d = _daemon_on(tmp_path, nvme, host_chunks=2).start()
    try:
        with KVStoreClient(d.url, use_shm=False) as client:
            tokens = list(range(6 * LAYOUT.chunk_tokens))
            keys = client.chunk_keys(tokens)
            assert client.put_many(keys, [make_chunk(LAYOUT, i) for i in range(6)]).ok
            _remount(nvme, "ro")
            reply = httpx.delete(f"{d.url}/v1/chunks/{keys[0].hex()}")
            assert reply.status_code == 503 and "Read-only" in reply.json()["detail"], reply.text
            assert client.lookup(tokens) == 6 * LAYOUT.chunk_tokens  # the index still says what the disk holds
            _remount(nvme, "rw")
            assert client.remove(keys[0]) and client.lookup(tokens) == 0
    finally:
        d.close()


def test_vanished_file_is_a_miss_that_leaves_the_index(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, host_chunks=2, nvme_chunks=64)
    try:
        with KVStoreClient(d.url, use_shm=False) as client:
            tokens = list(range(6 * LAYOUT.chunk_tokens))
            keys = client.chunk_keys(tokens)
            assert client.put_many(keys, [make_chunk(LAYOUT, i) for i in range(6)]).ok
            # An operator (or another process) deletes every chunk file under the running daemon. Which two
            # chunks the 2-chunk host tier kept is the eviction policy's choice; the other four are NVMe only.
            for key in keys:
                for path in (tmp_path / "nvme").rglob(f"{key.hex()}.kvc"):
                    path.unlink()
            assert client.lookup(tokens) == 6 * LAYOUT.chunk_tokens  # not known yet: the index still has them
            found = [client.get(key, make_chunk(LAYOUT, 0)) for key in keys]
            assert found.count(False) >= 4, found  # at most the host tier's two chunks are still served
            # Each miss dropped its entry: the prefix now ends at the first chunk that was not found.
            assert client.lookup(tokens) == found.index(False) * LAYOUT.chunk_tokens
    finally:
        d.close()


def _tier_gauge(daemon: Daemon, name: str, tier: str) -> float:
    """One tier's sample of gauge `name` in /metrics, read with prometheus_client's parser."""
    with daemon.client() as http:
        text = http.get("/metrics").text
    samples = [s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and s.labels == {"tier": tier}]
    assert len(samples) == 1, f"{name}{{tier={tier!r}}}: {samples}"
    return samples[0]


def _disk_figures(path: Path) -> tuple[int, int]:
    """(free bytes of the filesystem of `path`, disk bytes of the chunk files under it), as start-up reads them."""
    stat = os.statvfs(path)
    held = sum(p.stat().st_blocks * 512 for p in path.rglob("*.kvc"))
    return stat.f_bavail * stat.f_frsize, held


def test_restart_on_a_disk_another_process_filled_comes_up_capped(tmp_path: Path, tmpfs: Any) -> None:
    """Regression (issue 43): the NVMe filesystem filled by another file while the daemon ran; the
    restart was refused ("does not fit on disk"), a crash loop under systemd. Now it comes up with the
    effective capacity in one warning line, in stats and in /metrics, evicts down to it, and every chunk
    it kept reads back identical."""
    nvme = tmpfs("1m")
    d = _daemon_on(tmp_path, nvme, host_chunks=2, nvme_chunks=48)  # 768 KiB: fits the empty 1 MiB at first start
    d.start()
    num_chunks = 40
    try:
        with KVStoreClient(d.url, use_shm=False) as client:
            keys = client.chunk_keys(list(range(num_chunks * LAYOUT.chunk_tokens)))
            for i, key in enumerate(keys):  # one put each: 40 separate chunks, each on NVMe
                assert client.put_many([key], [make_chunk(LAYOUT, i)]).ok
            nvme_stats = client.stats()["tiers"]["nvme"]
            assert nvme_stats["chunks"] == num_chunks
            configured, footprint = nvme_stats["capacity_bytes"], nvme_stats["used_bytes"] // num_chunks
        free, _ = _disk_figures(nvme)
        (nvme / "filler").write_bytes(b"\0" * free)  # another process takes every free byte
    finally:
        assert d.stop() == 0
    free, held = _disk_figures(nvme)
    effective = int(0.9 * (free + held))  # the rule (docs/capacity.md): 90% of free + held
    kept = effective // footprint
    assert configured > free + held and 0 < kept < num_chunks  # the config no longer fits; the cap evicts
    again = Daemon(d.config, d.log).start()  # the same config, the same folder: it comes up
    try:
        with KVStoreClient(again.url, use_shm=False) as client:
            nvme_stats = client.stats()["tiers"]["nvme"]
            assert (nvme_stats["configured_capacity_bytes"], nvme_stats["capacity_bytes"]) == (configured, effective)
            assert nvme_stats["chunks"] == kept and nvme_stats["evictions"] == num_chunks - kept
            out, hits = make_chunk(LAYOUT, 0), 0
            for i, key in enumerate(keys):
                if client.get(key, out):
                    assert torch.equal(out, make_chunk(LAYOUT, i)), f"chunk {i} reads back different bytes"
                    hits += 1
            assert hits == kept  # every chunk that fits is still readable
        assert _tier_gauge(again, "kvstore_tier_configured_capacity_bytes", "nvme") == configured
        assert _tier_gauge(again, "kvstore_tier_capacity_bytes", "nvme") == effective
        warnings = [line for line in d.log.read_text().splitlines() if "WARNING" in line]
        assert len(warnings) == 1 and "does not fit at this restart" in warnings[0] and str(nvme) in warnings[0], warnings
    finally:
        again.close()


def test_first_start_larger_than_its_disk_is_still_refused(tmp_path: Path, tmpfs: Any) -> None:
    nvme = tmpfs("1m")
    with pytest.raises(RuntimeError, match="does not fit on disk"):
        _daemon_on(tmp_path, nvme, nvme_chunks=128).start(timeout_s=30)  # 2 MiB on an empty 1 MiB filesystem


def test_restart_with_a_full_tier_on_a_full_disk_comes_up_and_stores(tmp_path: Path, tmpfs: Any) -> None:
    """The tier at its capacity, then another file takes every free byte: the capacity still fits
    (free + held), but the start-up write probe met ENOSPC and refused the daemon. It comes up, and a
    new chunk reaches the disk by evicting an old one."""
    nvme = tmpfs("1m")
    d = _daemon_on(tmp_path, nvme, host_chunks=2, nvme_chunks=30)  # 480 KiB: 40 chunk files of 12 KiB
    d.start()
    try:
        with KVStoreClient(d.url, use_shm=False) as client:
            keys = client.chunk_keys(list(range(46 * LAYOUT.chunk_tokens)))
            for i, key in enumerate(keys[:45]):
                assert client.put_many([key], [make_chunk(LAYOUT, i)]).ok
            nvme_stats = client.stats()["tiers"]["nvme"]
            assert nvme_stats["used_bytes"] == nvme_stats["capacity_bytes"]  # full: it evicted to stay within
        free, _ = _disk_figures(nvme)
        (nvme / "filler").write_bytes(b"\0" * free)
    finally:
        assert d.stop() == 0
    again = Daemon(d.config, d.log).start()
    try:
        with KVStoreClient(again.url, use_shm=False) as client:
            assert client.stats()["tiers"]["nvme"]["chunks"] == nvme_stats["chunks"]  # nothing lost at the restart
            result = client.put_many([keys[45]], [make_chunk(LAYOUT, 45)])
            assert result.ok and not result.not_replicated, result.not_replicated
            assert client.stats()["tiers"]["nvme"]["evictions"] >= 1
    finally:
        again.close()
