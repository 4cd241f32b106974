"""`stream_decoder`: which streaming decoder a stored payload gets (zstd pieces as they land, else whole).

Above both streaming.py (the decoders' base) and zstd_planes.py (which builds on it), so neither
imports the other back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from policies.compression.streaming import StreamDecoder, WholeDecoder
from policies.compression.zstd_planes import ZstdPlanesCodec, ZstdStreamDecoder

if TYPE_CHECKING:
    import torch

    from kvstore.layout import KVLayout
    from policies.compression.base import Codec


def stream_decoder(codec: Codec, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> StreamDecoder:
    """The decoder for `codec` of a payload that will land in `payload` (a CPU buffer), into `out`."""
    if isinstance(codec, ZstdPlanesCodec) and out.device.type == "cpu" and out.is_contiguous():
        return ZstdStreamDecoder(codec, payload, out, layout)
    return WholeDecoder(codec, payload, out, layout)
