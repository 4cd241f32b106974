"""`Level`: one tier in the store with its policies, codec and background write queue."""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from kvstore.config import TierConfig
from kvstore.layout import KVLayout
from kvstore.types import ChunkMeta, TierKind
from policies.eviction import AccessInfo, make_eviction_policy
from tiers import Tier, make_tier

logger = logging.getLogger(__name__)

CODEC_NONE = 0


@dataclass(eq=False)
class Level:
    """A tier in speed order (index 0 = fastest), the policies that govern it and its writers."""

    index: int
    config: TierConfig
    tier: Tier
    eviction: Any
    admission: Any | None  # None: admit everything
    codec: Any | None  # None: store raw bytes
    queue: queue.Queue[bytes | None] | None = None
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def kind(self) -> TierKind:
        return self.config.kind

    @property
    def name(self) -> str:
        return self.config.kind.value

    @property
    def codec_id(self) -> int:
        return CODEC_NONE if self.codec is None else int(self.codec.codec_id)

    def admits(self, key: bytes, info: AccessInfo) -> bool:
        return self.admission is None or bool(self.admission.admit(key, info))

    def encode(self, raw: torch.Tensor, layout: KVLayout, key: bytes) -> tuple[torch.Tensor, ChunkMeta]:
        """The payload this level stores for a raw chunk (1-D uint8), and its metadata."""
        if self.codec is None:
            payload = raw
        else:
            payload = self.codec.encode(raw.view(layout.torch_dtype).view(layout.chunk_shape), layout)
        meta = ChunkMeta(codec_id=self.codec_id, raw_bytes=raw.numel(), stored_bytes=payload.numel(),
                         layout_fingerprint=layout.fingerprint)
        return payload, meta


def build_level(index: int, config: TierConfig, layout: KVLayout) -> Level:
    options = dict(config.options)
    if config.path is not None:
        options.setdefault("path", config.path)
    if config.kind in (TierKind.NVME, TierKind.PFS):
        options.setdefault("num_workers", config.num_workers)
    tier = make_tier(config.kind, capacity_bytes=config.capacity_bytes, **options)
    eviction = make_eviction_policy(config.eviction)
    admission = None
    if config.admission != "always":
        from policies.admission import make_admission_policy

        admission = make_admission_policy(config.admission)
    codec = None
    if config.codec != "none":
        from policies.compression import make_codec

        codec = make_codec(config.codec)
    return Level(index=index, config=config, tier=tier, eviction=eviction, admission=admission, codec=codec)


def decode_into(meta: ChunkMeta, payload: torch.Tensor, out_bytes: torch.Tensor, layout: KVLayout) -> None:
    """Turn a stored payload back into raw chunk bytes in `out_bytes`."""
    if meta.codec_id == CODEC_NONE:
        out_bytes[: payload.numel()].copy_(payload)
        return
    from policies.compression import codec_by_id

    out = out_bytes[: meta.raw_bytes].view(layout.torch_dtype).view(layout.chunk_shape)
    codec_by_id(meta.codec_id).decode_into(payload, out, layout)


class StagingBuffers(threading.local):
    """One reusable CPU buffer per thread, for reads that cannot land in the caller's memory."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def get(self, nbytes: int) -> torch.Tensor:
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
        return self.buffer[:nbytes]
