"""What NVMe and PFS tiers share: bad keys, corrupt/truncated/torn files, temp files, real full disks, pools."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.chunk_format import PAYLOAD_OFFSET
from kvstore.errors import BadChunkError, CorruptChunkError, TierIOError
from tests.helpers.forkserver import ForkServer
from tests.tiers.conftest import FILE_KINDS, key_of, meta_of, mounted, payload_of, try_mount
from tiers import chunk_files, file_io
from tiers.base import Tier
from tiers.dir_lock import LOCK_NAME

pytestmark = pytest.mark.parametrize("kind", FILE_KINDS, ids=lambda kind: kind.value)
MiB = 1 << 20


def _files(root: Any) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files
                  if f != LOCK_NAME)  # the NVMe tier's directory lock (tiers/dir_lock.py)


def _stored(make_tier: Callable[..., Tier], kind: Any, nbytes: Any=10_000, **options: Any) -> Any:
    tier = make_tier(kind, 16 * MiB, **options)
    payload = payload_of(5, nbytes)
    tier.put(key_of(5), payload, meta_of(payload))
    return tier, payload


@pytest.mark.parametrize("bad_key", [b"x" * 15, b"x" * 17, "../../../etc/passwd", None, 16], ids=repr)
def test_bad_keys_are_rejected_before_touching_files(make_tier: Callable[..., Tier], kind: Any, bad_key: Any) -> None:
    tier = make_tier(kind, MiB)
    payload = payload_of(0, 100)
    for call in (lambda: tier.put(bad_key, payload, meta_of(payload)), lambda: tier.remove(bad_key),
                 lambda: tier.get_into(bad_key, torch.empty(100, dtype=torch.uint8)), lambda: tier.meta(bad_key)):
        with pytest.raises(BadChunkError):
            call()
    assert _files(tier.root) == []  # type: ignore[attr-defined]


def test_meta_size_must_match_payload(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier = make_tier(kind, MiB)
    with pytest.raises(BadChunkError, match="stored_bytes"):
        tier.put(key_of(0), payload_of(0, 100), meta_of(payload_of(0, 99)))


def test_chunk_file_layout_on_disk(make_tier: Callable[..., Tier], kind: Any) -> None:
    """root/ab/cd/<32 hex>.kvc, 4 KiB header block + payload padded to 4 KiB, and no temp file left."""
    tier, _ = _stored(make_tier, kind, nbytes=10_000)
    name = key_of(5).hex()
    assert _files(tier.root) == [os.path.join(name[:2], name[2:4], name + ".kvc")]
    assert os.path.getsize(tier.chunk_path(key_of(5))) == PAYLOAD_OFFSET + 12_288 == tier.footprint(10_000)


def assert_corrupt_then_miss(tier: Any, damage: Any) -> None:
    path = tier.chunk_path(key_of(5))
    damage(path)
    with pytest.raises(CorruptChunkError):
        tier.get_into(key_of(5), torch.empty(MiB, dtype=torch.uint8))
    assert not os.path.exists(path)
    assert tier.get_into(key_of(5), torch.empty(MiB, dtype=torch.uint8)) is None
    assert tier.used_bytes == 0 and tier.num_corrupt_dropped == 1


def _flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0xFF]))


def test_flipped_payload_byte_is_corrupt_then_a_miss(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier, _ = _stored(make_tier, kind)
    assert_corrupt_then_miss(tier, lambda path: _flip_byte(path, PAYLOAD_OFFSET + 1234))


def test_truncated_file_is_corrupt_then_a_miss(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier, _ = _stored(make_tier, kind)
    assert_corrupt_then_miss(tier, lambda path: os.truncate(path, PAYLOAD_OFFSET + 5000))


def test_torn_header_is_corrupt_then_a_miss(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier, _ = _stored(make_tier, kind)
    assert_corrupt_then_miss(tier, lambda path: _flip_byte(path, 40))  # inside the stored-size field


def test_scan_drops_corrupt_files_and_stale_temps_keeps_fresh_temps(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier, payload = _stored(make_tier, kind)
    other = payload_of(6, 5000)
    tier.put(key_of(6), other, meta_of(other))
    _flip_byte(tier.chunk_path(key_of(6)), 10)  # torn header: the scan must drop it
    directory = os.path.dirname(tier.chunk_path(key_of(5)))
    stale, fresh = os.path.join(directory, ".stale.tmp"), os.path.join(directory, ".fresh.tmp")
    for path in (stale, fresh):
        with open(path, "wb") as file:
            file.write(b"half a chunk")
    day_ago = time.time() - 86_400
    os.utime(stale, (day_ago, day_ago))  # written before this tier started: an interrupted write
    assert dict(tier.keys()) == {key_of(5): meta_of(payload)}
    assert not os.path.exists(stale) and os.path.exists(fresh)  # fresh: maybe another writer's, in flight
    assert not os.path.exists(tier.chunk_path(key_of(6)))
    assert tier.used_bytes == tier.footprint(payload.numel())


def test_pool_paths_and_sync_writes(make_tier: Callable[..., Tier], kind: Any) -> None:
    tier = make_tier(kind, 32 * MiB, sync_writes=True)
    payloads = [payload_of(i, 100_000 + i) for i in range(8)]
    tier.put_many([(key_of(i), p, meta_of(p)) for i, p in enumerate(payloads)])
    tier.submit_put(key_of(8), payloads[0], meta_of(payloads[0])).result()
    outs = [torch.empty(200_000, dtype=torch.uint8) for _ in range(9)]
    sizes = tier.get_many([key_of(i) for i in range(9)], outs)
    assert sizes == [p.numel() for p in payloads] + [payloads[0].numel()]
    assert all(torch.equal(outs[i][: p.numel()], p) for i, p in enumerate(payloads))
    assert tier.submit_get(key_of(99), outs[0]).result() is None


def _assert_nothing_partial(tier: Any, key: Any) -> None:
    assert not tier.contains(key)
    assert not any(name.endswith(".tmp") for name in _files(tier.root))
    assert not os.path.exists(tier.chunk_path(key))


def test_full_disk_is_a_clear_error_and_leaves_nothing(make_tier: Callable[..., Tier], kind: Any, tmp_path: Path) -> None:
    """A real 1 MiB tmpfs: the 2 MiB chunk fails with ENOSPC; the tier keeps working afterwards."""
    with mounted("tmpfs", tmp_path / "small", "size=1m") as root:
        tier = make_tier(kind, 64 * MiB, path=root)
        small = payload_of(1, 100_000)
        tier.put(key_of(1), small, meta_of(small))
        used = tier.used_bytes
        with pytest.raises(TierIOError) as caught:
            tier.put(key_of(2), payload_of(2, 2 * MiB), meta_of(payload_of(2, 2 * MiB)))
        message = str(caught.value)
        assert caught.value.errno == errno.ENOSPC
        for part in ("No space left on device", tier.chunk_path(key_of(2)), str(tier.footprint(2 * MiB)),  # type: ignore[attr-defined]
                     "bytes free", "capacity_bytes"):
            assert part in message
        _assert_nothing_partial(tier, key_of(2))
        assert tier.used_bytes == used
        out = torch.empty(100_000, dtype=torch.uint8)
        assert tier.get_into(key_of(1), out) == 100_000 and torch.equal(out, small)


@pytest.fixture(scope="module")
def efbig_reports(tmp_path_factory: pytest.TempPathFactory, fork_server: ForkServer) -> tuple[dict, object]:
    """One real child process per module run, with RLIMIT_FSIZE 1 MiB, writing to an NVMe and a PFS tier."""
    root = tmp_path_factory.mktemp("limited")
    result = fork_server.run(["-m", "tests.programs.efbig_writer", str(root)], timeout_s=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), root


def test_file_size_limit_is_a_clear_error_and_leaves_nothing(make_tier: Callable[..., Tier], kind: Any, efbig_reports: tuple[dict, object]) -> None:
    """The kernel answers EFBIG mid-write; the message says so and how to fix it; nothing partial remains."""
    reports, root = efbig_reports
    report = reports[kind.value]
    assert report["errno"] == errno.EFBIG
    assert "File too large" in report["error"] and "ulimit -f" in report["error"]
    tier = make_tier(kind, 64 * MiB, path=root / kind.value)
    assert report["used"] == tier.footprint(100_000)
    assert {key for key, _ in tier.keys()} == {key_of(1)}
    _assert_nothing_partial(tier, key_of(2))


@pytest.fixture
def odirect_refusing_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A ramfs (refuses O_DIRECT with EINVAL for real); where mounting is impossible, os.open is patched."""
    root = tmp_path / "ramfs"
    if try_mount("ramfs", root) is None:
        yield root
        subprocess.run(["umount", "-l", str(root)], capture_output=True, check=False)
        return
    real_open = os.open

    def refusing_open(path: Any, flags: Any, *args: Any) -> Any:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(file_io.os, "open", refusing_open)
    yield tmp_path / "refusing"


def test_filesystem_refusing_odirect_falls_back_with_a_warning(make_tier: Callable[..., Tier], kind: Any, odirect_refusing_dir: Any, caplog: pytest.LogCaptureFixture) -> None:
    tier = make_tier(kind, 16 * MiB, path=odirect_refusing_dir, direct_io=True)
    payload = payload_of(3, MiB + 5)
    with caplog.at_level(logging.WARNING, logger="tiers.file_io"):
        tier.put(key_of(3), payload, meta_of(payload))
    assert any("refuses O_DIRECT" in record.getMessage() for record in caplog.records)
    out = file_io.aligned_empty(2 * MiB)
    assert tier.get_into(key_of(3), out) == MiB + 5 and torch.equal(out[: MiB + 5], payload)


def test_rescans_during_puts_lose_no_chunk(make_tier: Callable[..., Tier], kind: Any) -> None:
    """keys() rebuilds the index while another thread puts; puts that land mid-scan stay indexed."""
    tier = make_tier(kind, 64 * MiB)
    payloads = [payload_of(i, 20_000 + i) for i in range(40)]

    def writer() -> None:
        for i, payload in enumerate(payloads):
            tier.put(key_of(i), payload, meta_of(payload))

    thread = threading.Thread(target=writer)
    thread.start()
    while thread.is_alive():
        list(tier.keys())
    thread.join()
    assert tier.used_bytes == sum(tier.footprint(p.numel()) for p in payloads)
    assert len(tier) == 40  # type: ignore[arg-type]
    assert dict(tier.keys()) == {key_of(i): meta_of(p) for i, p in enumerate(payloads)}


def test_read_only_filesystem_is_a_clear_error(make_tier: Callable[..., Tier], kind: Any, tmp_path: Path) -> None:
    """A real read-only tmpfs: put fails with EROFS, says how to fix it, and the tier stays usable for reads."""
    with mounted("tmpfs", tmp_path / "ro", "size=1m,ro") as root:
        tier = make_tier(kind, 64 * MiB, path=root)
        with pytest.raises(TierIOError, match="read-only") as caught:
            tier.put(key_of(1), payload_of(1, 1000), meta_of(payload_of(1, 1000)))
        assert caught.value.errno == errno.EROFS and str(tier.footprint(1000)) in str(caught.value)
        assert tier.used_bytes == 0 and tier.get_into(key_of(1), torch.empty(1000, dtype=torch.uint8)) is None


def test_scan_never_removes_this_process_temp_files(make_tier: Callable[..., Tier], kind: Any) -> None:
    """Regression: a put racing keys() lost its temp file (rename failed with ENOENT) because file times come
    from a coarse clock and a fresh temp file could look older than the tier's start. Our own temps are
    writes in flight, whatever their age."""
    tier, payload = _stored(make_tier, kind)
    os.makedirs(os.path.dirname(tier.chunk_path(key_of(9))), exist_ok=True)
    own = chunk_files.temp_path(tier.chunk_path(key_of(9)), f"{tier._temp_tag}.12345")
    with open(own, "wb") as file:
        file.write(b"a write in flight")
    day_ago = time.time() - 86_400
    os.utime(own, (day_ago, day_ago))
    assert dict(tier.keys()) == {key_of(5): meta_of(payload)}
    assert os.path.exists(own)


def test_two_puts_of_one_key_leave_the_index_as_the_disk_is(make_tier: Callable[..., Tier], kind: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Thread A's rename lands first but A is descheduled before recording it; thread B then replaces the
    key. The index must end with B's chunk, the one on disk (a delay after A's rename stands in for the
    scheduler: the window is too narrow to hit on demand)."""
    tier = make_tier(kind, 16 * MiB)
    small, big = payload_of(1, 1_000), payload_of(2, 50_000)
    renamed_a = threading.Event()
    real_rename = os.rename

    def rename(src: Any, dst: Any) -> None:
        real_rename(src, dst)
        if threading.current_thread().name == "put-a":
            renamed_a.set()
            time.sleep(0.3)

    monkeypatch.setattr(os, "rename", rename)
    a = threading.Thread(target=tier.put, args=(key_of(1), small, meta_of(small)), name="put-a")
    a.start()
    assert renamed_a.wait(5)
    tier.put(key_of(1), big, meta_of(big))  # waits for A's record, then lands after it
    a.join()
    indexed = (tier.meta(key_of(1)), tier.used_bytes)
    on_disk = (dict(tier.keys()).get(key_of(1)), tier.used_bytes)  # keys() rescans the directory
    assert indexed == on_disk == (meta_of(big), tier.footprint(big.numel()))
