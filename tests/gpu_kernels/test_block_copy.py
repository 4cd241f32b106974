"""Gather/scatter: exact torch round trips, checks that reject bad input, nvcc compile, CUDA vs reference."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from gpu_kernels import cuda, gather_blocks, reference, scatter_blocks
from kvstore.errors import LayoutMismatchError

SHAPES = [  # (layers, planes, blocks, page, heads, dim)
    (2, 2, 10, 4, 2, 8),
    (3, 1, 7, 16, 1, 12),  # MLA-like: one plane, odd bytes per page for fp16 -> byte kernel
]


def _paged(shape: tuple[int, ...], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(shape, generator=gen).to(dtype).to(device)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gather_places_page_i_at_tokens_i_times_page(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    paged = _paged(shape, dtype)
    layers, planes, _, page, heads, dim = shape
    block_ids = [5, 0, 3]
    chunk = torch.empty(layers, planes, 3 * page, heads, dim, dtype=dtype)
    reference.gather_blocks(paged, block_ids, chunk)
    for i, block in enumerate(block_ids):
        assert torch.equal(chunk[:, :, i * page : (i + 1) * page], paged[:, :, block])


@pytest.mark.parametrize("shape", SHAPES)
def test_scatter_then_gather_round_trips_exactly(shape: tuple[int, ...]) -> None:
    layers, planes, blocks, page, heads, dim = shape
    chunk = torch.randn(layers, planes, 2 * page, heads, dim).to(torch.bfloat16)
    paged = torch.zeros(shape, dtype=torch.bfloat16)
    untouched = paged.clone()
    scatter_blocks(chunk, [4, 1], paged)
    back = torch.empty_like(chunk)
    gather_blocks(paged, [4, 1], back)
    assert torch.equal(back, chunk)
    others = [b for b in range(blocks) if b not in (4, 1)]
    assert torch.equal(paged[:, :, others], untouched[:, :, others])  # scatter wrote only its pages


def test_checks_reject_wrong_shape_dtype_ids_and_strides() -> None:
    paged = torch.zeros(2, 2, 4, 4, 2, 8)
    with pytest.raises(LayoutMismatchError, match="expected"):
        gather_blocks(paged, [0, 1], torch.empty(2, 2, 4, 2, 8))  # one page of room for two pages
    with pytest.raises(LayoutMismatchError, match="dtype"):
        gather_blocks(paged, [0], torch.empty(2, 2, 4, 2, 8, dtype=torch.float16))
    with pytest.raises(LayoutMismatchError, match=r"\[0, 4\)"):
        scatter_blocks(torch.empty(2, 2, 4, 2, 8), [4], paged)
    with pytest.raises(LayoutMismatchError, match="contiguous"):
        gather_blocks(paged, [0], torch.empty(2, 2, 4, 8, 2).transpose(3, 4))


def test_cuda_launch_checks_refuse_cpu_tensors() -> None:
    with pytest.raises(LayoutMismatchError, match="GPU"):
        cuda.check_launch(torch.zeros(1, 2, 2, 4, 1, 4), [0], torch.zeros(1, 2, 4, 1, 4))


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    candidates = sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))
    return str(candidates[-1]) if candidates else None


@pytest.mark.skipif(_find_nvcc() is None, reason="nvcc not installed")
def test_cu_source_compiles_to_ptx_with_vector_loads(tmp_path: Path) -> None:
    ptx = tmp_path / "block_copy.ptx"
    result = subprocess.run(
        [_find_nvcc(), "-ptx", "-arch=compute_80", str(cuda.SOURCE_PATH), "-o", str(ptx)],  # type: ignore[list-item]
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    text = ptx.read_text()
    for name in ("gather_blocks_v16", "scatter_blocks_v16", "gather_blocks_b1", "scatter_blocks_b1"):
        assert f".entry {name}" in text
    assert ".v4." in text  # the 16-byte vectorized copies survived compilation


gpu = pytest.mark.skipif(not cuda.is_available(), reason="needs CUDA and cupy")


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_kernels_match_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    paged = _paged(shape, dtype, "cuda")
    layers, planes, blocks, page, heads, dim = shape
    block_ids = [blocks - 1, 0, 2]
    got = torch.empty(layers, planes, 3 * page, heads, dim, dtype=dtype, device="cuda")
    want = torch.empty_like(got)
    cuda.gather_blocks(paged, block_ids, got)
    reference.gather_blocks(paged, block_ids, want)
    assert torch.equal(got, want)
    chunk = torch.randn_like(got.float()).to(dtype)
    a, b = paged.clone(), paged.clone()
    cuda.scatter_blocks(chunk, block_ids, a)
    reference.scatter_blocks(chunk, block_ids, b)
    torch.cuda.synchronize()
    assert torch.equal(a, b)


@pytest.mark.gpu
@gpu
def test_cuda_dispatch_is_used_for_gpu_tensors() -> None:
    from gpu_kernels import active_backend

    assert active_backend() == "cuda"
