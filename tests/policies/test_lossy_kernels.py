"""int8/fp8: the numba kernels write the same bytes as the torch path (the fallback, and the code that
wrote the chunks already on disk), exhaustively over the 16-bit input patterns and all 256 codes."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from kvstore.errors import ConfigError
from kvstore.layout import KVLayout
from policies.compression import lossy_fast, make_codec
from policies.compression.numba_support import optional_kernels

pytestmark = pytest.mark.skipif(lossy_fast.kernels() is None, reason="numba is not installed")
REPO = Path(__file__).resolve().parents[2]
HEAD_DIM = 128


def _layout(dtype: str, rows: int) -> KVLayout:
    assert rows % 4 == 0
    return KVLayout(num_layers=1, num_kv_heads=2, head_dim=HEAD_DIM, dtype=dtype, chunk_tokens=rows // 4)


def _codecs(name: str) -> tuple:
    return make_codec(name, threads=2, kernel="numba"), make_codec(name, threads=2, kernel="torch")


def _all_16bit_patterns(dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every finite bit pattern of a 16-bit float, in a seeded order, so rows mix magnitudes (and thus
    scales): the first order is sorted (rows of near-equal values), the others shuffled."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    values = bits.view(dtype)
    values = torch.where(values.float().isfinite(), values, torch.zeros((), dtype=dtype))
    if seed:
        values = values[torch.randperm(values.numel(), generator=torch.Generator().manual_seed(seed))]
    return values


def _encode_both(name: str, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, KVLayout]:
    layout = _layout(str(values.dtype).removeprefix("torch."), values.numel() // HEAD_DIM)
    chunk = values.reshape(layout.chunk_shape)
    fast, reference = _codecs(name)
    return fast.encode(chunk, layout), reference.encode(chunk, layout), layout


@pytest.mark.parametrize("name", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("amax", [None, 1.0, 2.0**-20, 448.0, 2.0**60])
def test_encode_matches_torch_over_every_16bit_pattern(name: str, dtype: torch.dtype, seed: int,
                                                        amax: float | None) -> None:
    """`amax` pins each row's largest value (None: the row's own; clamped to the dtype's range), so every
    pattern up to it is seen under a scale that sends small ones to fp8 subnormals and zero."""
    values = _all_16bit_patterns(dtype, seed)
    if amax is not None:
        amax = min(amax, torch.finfo(dtype).max)
        rows = values.reshape(-1, HEAD_DIM)
        rows.clamp_(-amax, amax)[:, 0] = amax
        values = rows.reshape(-1)
    fast, reference, _ = _encode_both(name, values)
    mismatched = (fast != reference).nonzero().reshape(-1)
    assert mismatched.numel() == 0, f"{mismatched.numel()} bytes differ, first at {mismatched[:8].tolist()}"


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_encode_matches_torch_on_float32(name: str) -> None:
    """float32: random bit patterns (every exponent) and values at the rounding edges of the codes."""
    generator = torch.Generator().manual_seed(5)
    bits = torch.randint(-(2**31), 2**31 - 1, (2**18,), dtype=torch.int64, generator=generator).to(torch.int32)
    values = bits.view(torch.float32)
    values = torch.where(values.isfinite(), values, torch.zeros(()))
    edges = torch.tensor([0.5, 1.5, 2.5, -2.5, 2**-9, 1.5 * 2**-9, 2**-10, 3 * 2**-10, 464.0, 447.9, 2**-6])
    values[: edges.numel()] = edges
    fast, reference, _ = _encode_both(name, values)
    assert torch.equal(fast, reference)


def _payload(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return torch.cat([scales.view(torch.uint8), codes.reshape(-1)])


@pytest.mark.parametrize("name", ["int8", "fp8"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_decode_matches_torch_for_every_code_and_many_scales(name: str, dtype: str) -> None:
    """All 256 codes in each row, under scales from float32 subnormals to ones that overflow float16; in
    the second half of the rows the fp8 nan codes become zeros (the rows fp8's faster decode takes)."""
    generator = torch.Generator().manual_seed(7)
    exponents = torch.randint(-140, 128, (512,), generator=generator)
    scales = (torch.rand(512, generator=generator) + 0.5) * torch.pow(2.0, exponents.float())
    scales[:4] = torch.tensor([1.0, 2.0**-24, 65504.0 / 448, 65520.0 / 127])
    scales[256:260] = torch.tensor([1.0, 127.99, 128.0, -3.0])
    codes = torch.arange(256, dtype=torch.uint8).repeat(512, 1)[:, torch.randperm(256, generator=generator)]
    codes[256:] = torch.where((codes[256:] & 0x7F) == 0x7F, codes[256:] & 0x80, codes[256:])
    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=256, dtype=dtype, chunk_tokens=256)
    payload = _payload(codes, scales.float())
    fast, reference = _codecs(name)
    out_fast, out_reference = (torch.empty(layout.chunk_shape, dtype=layout.torch_dtype) for _ in range(2))
    fast.decode_into(payload, out_fast, layout)
    reference.decode_into(payload, out_reference, layout)
    finite = out_reference.isfinite() | out_reference.isinf()  # nan codes: any nan will do
    assert torch.equal(out_fast[finite], out_reference[finite])
    assert torch.equal(out_fast.isnan(), out_reference.isnan())


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_decode_into_a_strided_view_and_from_an_unaligned_payload(name: str) -> None:
    layout = _layout("bfloat16", 64)
    chunk = (torch.randn(layout.chunk_shape, generator=torch.Generator().manual_seed(2)) * 5).to(torch.bfloat16)
    fast, reference = _codecs(name)
    payload = reference.encode(chunk, layout)
    shifted = torch.empty(payload.numel() + 1, dtype=torch.uint8)[1:]  # scales start off a 4-byte boundary
    shifted.copy_(payload)
    expected = torch.empty_like(chunk)
    reference.decode_into(payload, expected, layout)
    big = torch.zeros((2, *layout.chunk_shape), dtype=torch.bfloat16).transpose(0, 1)  # [1, 2, ...]: not contiguous
    fast.decode_into(shifted, big[:, 1], layout)
    assert torch.equal(big[:, 1].view(torch.int16), expected.view(torch.int16)) and not big[:, 0].any()


def test_concurrent_encodes_on_one_codec_give_the_bytes_of_one_at_a_time() -> None:
    """The store encodes from several worker threads with one codec; blocks are claimed per call."""
    layout = _layout("bfloat16", 4 * 2048)  # several 1 MiB blocks
    codec = make_codec("fp8", threads=2, kernel="numba")
    chunks = [(torch.randn(layout.chunk_shape, generator=torch.Generator().manual_seed(s)) * s).to(torch.bfloat16)
              for s in range(1, 5)]
    expected = [codec.encode(chunk, layout) for chunk in chunks]
    results: dict[int, torch.Tensor] = {}

    def encode(index: int) -> None:
        results[index] = codec.encode(chunks[index], layout)

    threads = [threading.Thread(target=encode, args=(i,)) for i in range(len(chunks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(results[i], expected[i]) for i in range(len(chunks)))


def test_kernel_option_is_checked_and_the_path_in_use_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="kernel 'cuda' is not one of auto, numba, torch"):
        make_codec("int8", kernel="cuda")
    optional_kernels.cache_clear()
    with caplog.at_level(logging.INFO, logger="policies.compression.numba_support"):
        assert lossy_fast.supports(torch.bfloat16) and not lossy_fast.supports(torch.float8_e4m3fn)
    assert [r.getMessage() for r in caplog.records] == ["numba kernels in use: policies.compression.lossy_kernels"]


def test_without_numba_the_torch_path_writes_the_same_bytes(tmp_path: Path) -> None:
    """A process where numba cannot be imported: one warning, and the payload of the numba path."""
    layout = _layout("bfloat16", 64)
    chunk = (torch.randn(layout.chunk_shape, generator=torch.Generator().manual_seed(9)) * 3).to(torch.bfloat16)
    torch.save(chunk, tmp_path / "chunk.pt")
    np.save(tmp_path / "expected.npy", make_codec("fp8", kernel="numba").encode(chunk, layout).numpy())
    script = f"""
import logging, sys, numpy, torch
sys.modules["numba"] = None  # import numba now raises ImportError
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from kvstore.layout import KVLayout
from policies.compression import make_codec
layout = KVLayout(num_layers=1, num_kv_heads=2, head_dim={HEAD_DIM}, dtype="bfloat16", chunk_tokens=16)
payload = make_codec("fp8").encode(torch.load({str(tmp_path / 'chunk.pt')!r}), layout)
assert (payload.numpy() == numpy.load({str(tmp_path / 'expected.npy')!r})).all()
try:
    make_codec("int8", kernel="numba")
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING numba unavailable")]
    assert len(warnings) == 1 and "torch path" in warnings[0]
    assert "ConfigError int8 kernel 'numba' needs numba" in done.stdout
