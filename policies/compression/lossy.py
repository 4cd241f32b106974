"""Lossy codecs `int8` and `fp8` (e4m3): one scale per token and head, symmetric. Off unless configured.

Two paths write the same bytes: numba kernels (`lossy_fast.py`, bfloat16/float16/float32 chunks, one
pass per row) and torch ops over blocks of vectors small enough for one core's cache (every dtype;
the fallback without numba). Both spread row blocks over `threads` threads
(`policies/compression/blocks.py` says why not torch's own thread pool).

Payload: ``[scales: float32, one per (layer, plane, token, head)] [codes: 1 byte per element]``.
A scale covers the `head_dim` values of one token's head, so an outlier channel only costs
precision inside its own vector. Stated error bounds (checked by tests, measured by
`kvstore bench codecs`), with `amax` the largest |x| of the vector and `eps` the output dtype's
rounding (2**-8 relative for bfloat16, 2**-11 for float16):

* int8:  |x' - x| <= amax / 254 + eps * |x'|
* fp8:   |x' - x| <= 2**-4 * |x| + amax / 448 * 2**-10 + eps * |x'|  (3 mantissa bits; subnormals)
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod

import torch

from kvstore.errors import ConfigError, CorruptChunkError
from kvstore.layout import KVLayout
from policies.compression import lossy_fast
from policies.compression.blocks import default_threads, for_blocks
from policies.compression.lossless import chunk_bytes
from policies.compression.registry import register_codec

logger = logging.getLogger(__name__)


class _ScaledCodec(ABC):
    """Per-(token, head) symmetric quantisation to a 1-byte code."""

    name = ""
    codec_id = -1
    lossless = False
    code_max = 1.0
    is_fp8 = False

    @abstractmethod
    def _quantize_into(self, scaled: torch.Tensor, codes: torch.Tensor) -> None:
        """Scaled float32 values (may be overwritten) -> stored 1-byte codes (a uint8 view) in `codes`."""

    @abstractmethod
    def _dequantize_into(self, stored: torch.Tensor, values: torch.Tensor, aux: torch.Tensor) -> None:
        """Stored uint8 codes -> their float32 values in `values` (`aux`: a float32 scratch of the same shape)."""

    def __init__(self, threads: int = 0, kernel: str = "auto") -> None:
        """Args: threads: 0 = every core. kernel: `numba`, `torch` or `auto` (numba where it imports)."""
        if kernel not in ("auto", "numba", "torch"):
            raise ConfigError(f"{self.name} kernel {kernel!r} is not one of auto, numba, torch")
        if kernel == "numba" and lossy_fast.kernels() is None:
            raise ConfigError(f"{self.name} kernel 'numba' needs numba: pip install numba, or use kernel 'auto'")
        self.threads = threads or default_threads()
        self.kernel = kernel

    def _fast(self, dtype: torch.dtype) -> bool:
        return self.kernel != "torch" and lossy_fast.supports(dtype)

    @staticmethod
    def _num_vectors(layout: KVLayout) -> int:
        return layout.chunk_bytes // layout.itemsize // layout.head_dim

    def encode(self, chunk: torch.Tensor, layout: KVLayout) -> torch.Tensor:
        chunk_bytes(chunk, layout)  # validates shape and dtype
        x = chunk.detach().to("cpu").contiguous().reshape(-1, layout.head_dim)
        num = x.shape[0]
        out = torch.empty(num * 4 + x.numel(), dtype=torch.uint8)
        scales = out[: num * 4].view(torch.float32).reshape(num, 1)
        codes = out[num * 4:].reshape(num, layout.head_dim)
        if self._fast(x.dtype):
            lossy_fast.encode(x, self.is_fp8, scales.reshape(num), codes, self.threads)
        else:
            for_blocks(num, layout.head_dim, self.threads, lambda rows, scratch: self._encode_block(
                x[rows], scales[rows], codes[rows], scratch))
        return out

    def _encode_block(self, x: torch.Tensor, scales: torch.Tensor, codes: torch.Tensor, scratch: torch.Tensor) -> None:
        block = scratch[0, : x.shape[0]]
        block.copy_(x)
        low, high = torch.aminmax(block, dim=1, keepdim=True)  # no |x| temporary
        torch.maximum(high, low.neg_(), out=scales)
        scales.div_(self.code_max).masked_fill_(scales <= 0, 1.0)
        self._quantize_into(block.mul_(scales.reciprocal()), codes)

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        num = self._num_vectors(layout)
        payload = payload.to("cpu")
        if payload.numel() != num * 4 + num * layout.head_dim:
            raise CorruptChunkError(
                f"{self.name} payload is {payload.numel()} bytes, layout needs {num * 4 + num * layout.head_dim}"
            )
        head = payload[: num * 4]
        scales = (head if head.storage_offset() % 4 == 0 else head.clone()).view(torch.float32).reshape(num, 1)
        codes = payload[num * 4:].reshape(num, layout.head_dim)
        direct = out.device.type == "cpu" and out.is_contiguous()
        target = out.view(-1, layout.head_dim) if direct else torch.empty(num, layout.head_dim, dtype=out.dtype)
        if self._fast(out.dtype):
            lossy_fast.decode(codes, scales.reshape(num), self.is_fp8, target, self.threads)
        else:
            self._decode_torch(codes, scales, target)
        if not direct:
            out.copy_(target.reshape(layout.chunk_shape))

    def _decode_torch(self, codes: torch.Tensor, scales: torch.Tensor, target: torch.Tensor) -> None:
        def decode_block(rows: slice, scratch: torch.Tensor) -> None:
            block, aux = scratch[0, : rows.stop - rows.start], scratch[1, : rows.stop - rows.start]
            self._dequantize_into(codes[rows], block, aux)
            target[rows].copy_(block.mul_(scales[rows]))

        for_blocks(codes.shape[0], codes.shape[1], self.threads, decode_block)

    def max_encoded_bytes(self, raw_bytes: int) -> int:
        return 5 * raw_bytes  # loose: 1 byte per element (<= 1 per raw byte) plus a 4-byte scale per vector


@register_codec
class Int8Codec(_ScaledCodec):
    """int8, round to nearest, scale = amax / 127 per token and head."""

    name = "int8"
    codec_id = 2
    code_max = 127.0

    def _quantize_into(self, scaled: torch.Tensor, codes: torch.Tensor) -> None:
        codes.view(torch.int8).copy_(scaled.round_())  # |x| * (127 / amax) <= 127 + 1 ulp rounds to 127

    def _dequantize_into(self, stored: torch.Tensor, values: torch.Tensor, aux: torch.Tensor) -> None:
        values.copy_(stored.view(torch.int8))


_FP8_VALUES = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # code byte -> value


@register_codec
class FP8Codec(_ScaledCodec):
    """float8 e4m3 (torch.float8_e4m3fn), scale = amax / 448 per token and head."""

    name = "fp8"
    codec_id = 3
    code_max = 448.0
    is_fp8 = True

    def _quantize_into(self, scaled: torch.Tensor, codes: torch.Tensor) -> None:
        codes.view(torch.float8_e4m3fn).copy_(scaled.clamp_(-448.0, 448.0))

    def _dequantize_into(self, stored: torch.Tensor, values: torch.Tensor, aux: torch.Tensor) -> None:
        # torch converts float8 to float32 one scalar at a time on CPU; a 256-entry table gather is ~3x faster
        index = aux.view(torch.int32)
        index.copy_(stored)
        torch.index_select(_FP8_VALUES, 0, index.reshape(-1), out=values.reshape(-1))
