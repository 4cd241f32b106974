"""`GPUTier`: a device-memory arena of slots (CUDA when present; device "cpu" in CPU tests)."""

from __future__ import annotations

import logging

import torch

from kvstore.errors import ConfigError
from kvstore.types import TierKind
from tiers.arena import ArenaTier
from tiers.registry import register_tier

logger = logging.getLogger(__name__)


@register_tier
class GPUTier(ArenaTier):
    """Chunks in GPU memory. `device=None` picks cuda:0 when available, else "cpu" (for tests)."""

    kind = TierKind.GPU

    def __init__(self, *, capacity_bytes: int, device: str | None = None) -> None:
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
            if device == "cpu":
                logger.warning("GPU tier: CUDA is not available; the tier runs on device 'cpu'")
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise ConfigError(f"GPU tier device {device!r} asked for but CUDA is not available; set device='cpu' or drop the tier")
        super().__init__(capacity_bytes=capacity_bytes, device=device)
