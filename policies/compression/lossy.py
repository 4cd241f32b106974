"""Lossy codecs `int8` and `fp8` (e4m3): one scale per token and head, symmetric. Off unless configured.

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

from kvstore.errors import CorruptChunkError
from kvstore.layout import KVLayout
from policies.compression.lossless import chunk_bytes
from policies.compression.registry import register_codec

logger = logging.getLogger(__name__)


class _ScaledCodec(ABC):
    """Per-(token, head) symmetric quantisation to a 1-byte code."""

    name = ""
    codec_id = -1
    lossless = False
    code_max = 1.0

    @abstractmethod
    def _quantize(self, scaled: torch.Tensor) -> torch.Tensor:
        """Scaled values in [-code_max, code_max] -> stored codes."""

    @abstractmethod
    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        """Stored codes -> scaled values."""

    @staticmethod
    def _num_vectors(layout: KVLayout) -> int:
        return layout.chunk_bytes // layout.itemsize // layout.head_dim

    def encode(self, chunk: torch.Tensor, layout: KVLayout) -> torch.Tensor:
        chunk_bytes(chunk, layout)  # validates shape and dtype
        x = chunk.detach().to("cpu").reshape(-1, layout.head_dim).float()
        scales = x.abs().amax(dim=1, keepdim=True) / self.code_max
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = self._quantize(x / scales)
        num = scales.numel()
        out = torch.empty(num * 4 + codes.numel(), dtype=torch.uint8)
        out[: num * 4] = scales.reshape(-1).view(torch.uint8)
        out[num * 4 :] = codes.reshape(-1).view(torch.uint8)
        return out

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        num = self._num_vectors(layout)
        payload = payload.to("cpu")
        if payload.numel() != num * 4 + num * layout.head_dim:
            raise CorruptChunkError(
                f"{self.name} payload is {payload.numel()} bytes, layout needs {num * 4 + num * layout.head_dim}"
            )
        scales = payload[: num * 4].clone().view(torch.float32).reshape(num, 1)
        values = self._dequantize(payload[num * 4 :].reshape(num, layout.head_dim)) * scales
        out.copy_(values.reshape(layout.chunk_shape))

    def max_encoded_bytes(self, raw_bytes: int) -> int:
        return 5 * raw_bytes  # loose: 1 byte per element (<= 1 per raw byte) plus a 4-byte scale per vector


@register_codec
class Int8Codec(_ScaledCodec):
    """int8, round to nearest, scale = amax / 127 per token and head."""

    name = "int8"
    codec_id = 2
    code_max = 127.0

    def _quantize(self, scaled: torch.Tensor) -> torch.Tensor:
        return scaled.round().clamp_(-127, 127).to(torch.int8)

    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.view(torch.int8).float()


@register_codec
class FP8Codec(_ScaledCodec):
    """float8 e4m3 (torch.float8_e4m3fn), scale = amax / 448 per token and head."""

    name = "fp8"
    codec_id = 3
    code_max = 448.0

    def _quantize(self, scaled: torch.Tensor) -> torch.Tensor:
        return scaled.clamp_(-448.0, 448.0).to(torch.float8_e4m3fn)

    def _dequantize(self, codes: torch.Tensor) -> torch.Tensor:
        return codes.view(torch.float8_e4m3fn).float()
