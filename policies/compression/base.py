"""The `Codec` protocol (encode a KV chunk into a 1-D uint8 payload, decode it into a caller buffer)
and the `CompressionPolicy` protocol (which codec a chunk gets, and what a full tier does with a victim)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from kvstore.layout import KVLayout
    from policies.compression.policy import ChunkState, PressureDecision


@runtime_checkable
class Codec(Protocol):
    """A chunk codec. Codecs are stateless and thread-safe.

    Attributes:
        name: registry name (`none`, `lz4`, `int8`, `fp8`).
        codec_id: the id written in the chunk header (none=0, lz4=1, int8=2, fp8=3).
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


@runtime_checkable
class CompressionPolicy(Protocol):
    """Decides codecs and pressure actions; never moves bytes. Tiers are named by TierKind value."""

    name: str

    def codec_for(self, tier: str, reuse_probability: float = 0.5) -> str:
        """The codec a chunk gets when it is written to `tier`."""
        ...

    def on_pressure(self, tier: str, chunk: ChunkState) -> PressureDecision:
        """Compress in place, demote or drop one victim of a full `tier`."""
        ...

    def read_bytes_per_s(self, tier: str) -> float:
        """The read bandwidth this policy assumes for `tier` (its cost model's input)."""
        ...
