"""tiers/file_io.py: aligned buffers, O_DIRECT and buffered pread/pwrite round trips, staging reuse, baseline."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from kvstore.chunk_format import ALIGN, round_up
from tests.tiers.conftest import payload_of
from tiers import file_io

MiB = 1 << 20
SIZES = [1, 4095, 4096, 4097, file_io.STAGING_BYTES + 4097]  # the last one moves through staging in pieces


@pytest.mark.parametrize("nbytes", [1, 4096, 12_345, 3 * MiB])
def test_aligned_empty_is_aligned(nbytes: Any) -> None:
    buf = file_io.aligned_empty(nbytes)
    assert buf.numel() == nbytes and buf.data_ptr() % ALIGN == 0 and file_io.is_aligned(buf)


def _open(path: Any, direct: Any, write: Any) -> Any:
    flags = (os.O_RDWR | os.O_CREAT) if write else os.O_RDONLY
    return file_io.open_file(str(path), flags, direct=direct)


@pytest.mark.parametrize("head", [b"", b"header!"], ids=["no-head", "head"])
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("nbytes", SIZES)
def test_pwrite_then_pread_round_trips(tmp_path: Path, direct: Any, aligned: Any, nbytes: Any, head: Any) -> None:
    """[head block] + tensor + zero padding lands where pread expects it, in every alignment case."""
    data = payload_of(nbytes, nbytes)
    src = file_io.aligned_empty(nbytes) if aligned else torch.empty(nbytes + 1, dtype=torch.uint8)[1:]
    src.copy_(data)
    fd, is_direct = _open(tmp_path / "f", direct, write=True)
    if direct and not is_direct:
        os.close(fd)
        pytest.skip("this filesystem refuses O_DIRECT")
    try:
        offset = 0 if head else ALIGN
        assert file_io.pwrite_tensor(fd, src, offset, direct=is_direct, head=head) == ALIGN * bool(head) + round_up(nbytes)
    finally:
        os.close(fd)
    content = (tmp_path / "f").read_bytes()
    assert len(content) == ALIGN + round_up(nbytes)  # padded to 4 KiB with zeros
    assert content[ALIGN + nbytes :] == bytes(round_up(nbytes) - nbytes)
    if head:
        assert content[:ALIGN] == head.ljust(ALIGN, b"\0")
    out = file_io.aligned_empty(nbytes + 1) if aligned else torch.empty(nbytes + 2, dtype=torch.uint8)[1:]
    fd, is_direct = _open(tmp_path / "f", direct, write=False)
    try:
        assert file_io.pread_tensor(fd, out, nbytes, ALIGN, direct=is_direct) == nbytes
    finally:
        os.close(fd)
    assert torch.equal(out[:nbytes], data)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "unaligned"])
@pytest.mark.parametrize("nbytes", [1, 4096, 4097, 3 * MiB + 5])
def test_block_and_tensor_come_back_in_one_read(tmp_path: Path, direct: Any, aligned: Any, nbytes: Any) -> None:
    data = payload_of(nbytes, nbytes)
    fd, is_direct = _open(tmp_path / "f", False, write=True)
    try:
        file_io.pwrite_tensor(fd, data, 0, direct=False, head=b"the header block")
    finally:
        os.close(fd)
    out = file_io.aligned_empty(nbytes) if aligned else torch.empty(nbytes + 1, dtype=torch.uint8)[1:]
    fd, is_direct = _open(tmp_path / "f", direct, write=False)
    try:
        head, got = file_io.pread_block_and_tensor(fd, out, nbytes, 0, direct=is_direct)
    finally:
        os.close(fd)
    assert head == b"the header block".ljust(ALIGN, b"\0") and got == nbytes
    assert torch.equal(out, data)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "buffered"])
def test_pread_reports_a_short_file(tmp_path: Path, direct: Any) -> None:
    path = tmp_path / "short"
    path.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    out = file_io.aligned_empty(5 * ALIGN)
    fd, is_direct = _open(path, direct, write=False)
    try:
        assert file_io.pread_tensor(fd, out, 5 * ALIGN, 0, direct=is_direct) == 10_240
    finally:
        os.close(fd)
    assert bytes(out[:10_240].numpy()) == bytes(range(256)) * 40


def test_staging_buffer_is_reused_per_thread() -> None:
    first = file_io.staging_buffer(100).data_ptr()
    assert file_io.staging_buffer(ALIGN).data_ptr() == first  # no new allocation for a smaller request
    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(file_io.staging_buffer(100).data_ptr()))
    thread.start()
    thread.join()
    assert other[0] != first


def test_raw_odirect_baseline_measures_and_cleans_up(tmp_path: Path) -> None:
    result = file_io.raw_odirect_throughput(str(tmp_path), 4 * MiB, repeats=2)
    assert result["write_gbps"] > 0 and result["read_gbps"] > 0 and result["direct"] in (0.0, 1.0)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs fincore(1) to see page-cache residency")
def test_evict_page_cache_drops_a_tree_from_memory(tmp_path: Path) -> None:
    fs_type = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if fs_type in ("tmpfs", "ramfs"):
        pytest.skip(f"tmp_path is on {fs_type}, whose pages live only in memory")
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/one", "a/b/two"):
        (tmp_path / name).write_bytes(os.urandom(2 * MiB))  # buffered: dirty pages in the page cache

    def resident_bytes() -> int:
        out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(tmp_path / "a" / "one"),
                              str(tmp_path / "a" / "b" / "two")], capture_output=True, text=True, check=True).stdout
        return sum(int(line) for line in out.split())

    assert resident_bytes() > 0
    assert file_io.evict_page_cache(str(tmp_path)) == 2
    assert resident_bytes() == 0
    assert len((tmp_path / "a" / "one").read_bytes()) == 2 * MiB
