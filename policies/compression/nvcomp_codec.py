"""`nvcomp-lz4` (id 6): LZ4 on the GPU with nVIDIA nvCOMP where CUDA and `nvidia-nvcomp-cu12` exist, else blosc2.

    payload: [ mode: 1 byte | 7 zero bytes | body ]
      mode 0 (blosc): body is a blosc-lz4 payload, written where nvCOMP or CUDA is missing (the CPU twin)
      mode 1 (gpu):   body is an nvCOMP LZ4 bitstream (NVCOMP_NATIVE: header, chunked, self-sizing)

A GPU chunk is encoded where it lives (no device-to-host copy of the raw bytes: only the smaller
payload crosses PCIe). nvCOMP is detected once, at first use; its absence is logged once. A
mode-1 chunk read by a process without nvCOMP raises TierIOError (a miss that keeps the chunk,
so a GPU node can still read it), not CorruptChunkError (which would drop it).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

import torch

from kvstore.errors import CorruptChunkError, TierIOError
from kvstore.layout import KVLayout
from policies.compression.blosc import BloscLZ4Codec
from policies.compression.lossless import chunk_bytes, copy_bytes_into
from policies.compression.registry import register_codec

logger = logging.getLogger(__name__)

_BLOSC, _GPU = 0, 1
_HEADER_BYTES = 8
_local = threading.local()  # nvCOMP codecs hold scratch state: one per thread


@functools.lru_cache(maxsize=1)
def nvcomp_module() -> Any | None:
    """The `nvidia.nvcomp` module when it imports and CUDA is available, else None (logged once)."""
    if not torch.cuda.is_available():
        logger.info("nvcomp-lz4: no CUDA device; encoding with the blosc2 CPU path")
        return None
    try:
        from nvidia import nvcomp  # type: ignore[import-not-found]
    except ImportError as exc:
        logger.warning("nvcomp-lz4: nvidia-nvcomp-cu12 not importable (%s); encoding with the blosc2 CPU path "
                       "(pip install 'kvstore[nvcomp]' for the GPU path)", exc)
        return None
    return nvcomp


def _gpu_codec(nvcomp: Any) -> Any:
    codec = getattr(_local, "codec", None)  # per-thread instance (nvCOMP codecs are thread-local)
    if codec is None:
        codec = _local.codec = nvcomp.Codec(algorithm="LZ4")
    return codec


@register_codec
class NvcompLZ4Codec:
    """LZ4 on the GPU for chunks in GPU memory; the blosc-lz4 CPU path otherwise (same codec id)."""

    name = "nvcomp-lz4"
    codec_id = 6
    lossless = True

    def __init__(self, threads: int = 0) -> None:
        self._cpu = BloscLZ4Codec(threads=threads)

    def encode(self, chunk: torch.Tensor, layout: KVLayout) -> torch.Tensor:
        nvcomp = nvcomp_module()
        if nvcomp is None or chunk.device.type != "cuda":
            return _framed(_BLOSC, self._cpu.encode(chunk, layout))
        raw = chunk.detach().contiguous().reshape(-1).view(torch.uint8)
        if raw.numel() != layout.chunk_bytes:
            chunk_bytes(chunk.cpu(), layout)  # raises the layout error with its message
        encoded = _gpu_codec(nvcomp).encode(nvcomp.as_array(raw))
        body = torch.from_dlpack(encoded).reshape(-1).view(torch.uint8)
        return _framed(_GPU, body.cpu())

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        if payload.numel() < _HEADER_BYTES or int(payload[0]) not in (_BLOSC, _GPU):
            raise CorruptChunkError("nvcomp-lz4 payload has no valid mode byte; the chunk is damaged")
        body = payload[_HEADER_BYTES:]
        if int(payload[0]) == _BLOSC:
            self._cpu.decode_into(body, out, layout)
            return
        nvcomp = nvcomp_module()
        if nvcomp is None:
            raise TierIOError("chunk was compressed with nvCOMP on a GPU and this process has no CUDA or "
                              "nvidia-nvcomp-cu12; read it on a GPU node or install kvstore[nvcomp]")
        device = out.device if out.device.type == "cuda" else torch.device("cuda")
        try:
            decoded = _gpu_codec(nvcomp).decode(nvcomp.as_array(body.to(device)))
        except Exception as exc:  # nvCOMP raises its own runtime errors for a damaged bitstream
            raise CorruptChunkError(f"nvcomp-lz4 payload does not decompress: {exc}") from exc
        copy_bytes_into(torch.from_dlpack(decoded).reshape(-1).view(torch.uint8), out, layout)

    def max_encoded_bytes(self, raw_bytes: int) -> int:
        # LZ4's worst case (raw + raw/255 + 16 per 64 KiB chunk) plus nvCOMP's header, generously
        return _HEADER_BYTES + raw_bytes + raw_bytes // 128 + (1 << 16)


def _framed(mode: int, body: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(_HEADER_BYTES + body.numel(), dtype=torch.uint8)
    out[0] = mode
    out[_HEADER_BYTES:] = body
    return out
