"""Storage tiers behind one `Tier` ABC: GPU and host arenas, NVMe and PFS files, Redis."""

from tiers.base import Tier
from tiers.registry import make_tier, register_tier, tier_class

__all__ = ["Tier", "make_tier", "register_tier", "tier_class"]
