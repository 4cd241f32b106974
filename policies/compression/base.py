"""The `Codec` protocol (encode a KV chunk into a 1-D uint8 payload, decode it into a caller buffer)
and the `CompressionPolicy` protocol (which codec a chunk gets, and what a full tier does with a victim)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    import torch

    from kvstore.layout import KVLayout


@runtime_checkable
class Codec(Protocol):
    """A chunk codec. Codecs are stateless and thread-safe.

    Attributes:
        name: registry name (`none`, `lz4`, `int8`, `fp8`, `blosc-lz4`, `blosc-zstd`, `nvcomp-lz4`,
            `zstd`).
        codec_id: the id written in the chunk header (none=0, lz4=1, int8=2, fp8=3, blosc-lz4=4,
            blosc-zstd=5, nvcomp-lz4=6, zstd=7); ids are never reused, so every stored chunk stays readable.
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
class BufferEncoder(Protocol):
    """A codec that can write its payload into a buffer the caller reuses (a store's writer thread
    encodes chunk after chunk: a fresh payload each time costs its page faults, about a fifth of a
    zstd encode of a 32 MiB chunk)."""

    def encode_into(self, chunk: torch.Tensor, layout: KVLayout, buffer: torch.Tensor) -> torch.Tensor:
        """`encode`'s payload written into `buffer` (1-D uint8 CPU, 4 KiB-aligned, at least
        `max_encoded_bytes(chunk bytes)`); returns the view of `buffer` that holds it."""
        ...


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkState:
    """What the store knows about a chunk when its tier is under pressure."""

    raw_bytes: int
    stored_bytes: int
    codec: str = "none"
    reuse_probability: float = 0.5
    has_lower_copy: bool = False
    lower_read_bytes_per_s: float | None = None  # None: no tier below
    lower_write_bytes_per_s: float | None = None
    recompute_s: float = 0.05


@dataclass(frozen=True, slots=True)
class PressureDecision:
    """`compress` (re-encode in place with `codec`), `demote` (write below, then drop), or `drop`."""

    action: Literal["compress", "demote", "drop"]
    codec: str | None
    bytes_freed: int
    cost_s: float
    reason: str = field(default="")



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

    def put_keeps_pace(self, tier: str, codec: str) -> bool:
        """Whether encoding every chunk written to `tier` with `codec` keeps 0.9 of the tier's raw write."""
        ...
