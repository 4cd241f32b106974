"""The `Codec` protocol: encode a KV chunk into a 1-D uint8 payload and decode it into a caller buffer."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from kvstore.layout import KVLayout


@runtime_checkable
class Codec(Protocol):
    """A chunk codec. Codecs are stateless and thread-safe.

    Attributes:
        name: registry name (`none`, `lz4`, `int8`, `fp8`, `blosc-lz4`, `blosc-zstd`, `nvcomp-lz4`).
        codec_id: the id written in the chunk header (none=0, lz4=1, int8=2, fp8=3, blosc-lz4=4,
            blosc-zstd=5, nvcomp-lz4=6); ids are never reused, so every stored chunk stays readable.
        lossless: decode(encode(x)) is byte-identical to x.
    """

    name: str
    codec_id: int
    lossless: bool

    def encode(self, chunk: torch.Tensor, layout: KVLayout) -> torch.Tensor:
        """A 1-D uint8 CPU tensor holding the encoded chunk (`chunk` has layout.chunk_shape/dtype,
        any device). It may share memory with `chunk`: copy it before changing `chunk`."""
        ...

    def decode_into(self, payload: torch.Tensor, out: torch.Tensor, layout: KVLayout) -> None:
        """Decode `payload` (1-D uint8) into `out` (layout.chunk_shape, layout's dtype, any device).

        Raises:
            CorruptChunkError: the payload does not decode to a chunk of this layout.
        """
        ...

    def max_encoded_bytes(self, raw_bytes: int) -> int:
        """An upper bound of the payload size for a chunk of `raw_bytes` bytes."""
        ...
