"""Start-up checks of a StoreConfig against the tier and policy registries, before the store opens.

Each failure is a ConfigError of one line naming the tier, the field, the value and the fix:
eviction, admission and codec names, the compression policy's name, tier options, and a local
tier directory locked by another live kvstore process. The checks against the machine (memory,
paths) need no registry and live on the ground floor (`kvstore.preflight.check_machine`): callers
run those first, so a config too large for the machine is refused before torch loads.
"""

from __future__ import annotations

import inspect
import os

from kvstore.config import StoreConfig, TierConfig
from kvstore.errors import ConfigError, KVStoreError
from kvstore.preflight import LOCAL_DIR_KINDS
from policies.admission import admission_policy_names
from policies.compression.registry import codec_names, compression_policy_names
from policies.eviction import eviction_policy_names
from policies.eviction.registry import REPLAY_ONLY, replay_only_message
from tiers.dir_lock import holder_pid, lock_path, locked_message
from tiers.registry import tier_class


def check_tier_settings(config: StoreConfig) -> None:
    """Directory locks, then each tier's names and options, then the compression policy's name."""
    check_locks(config)
    for tier in config.tiers:
        check_names(tier)
        check_options(tier)
    check_compression(config)


def check_names(tier: TierConfig) -> None:
    if tier.eviction in REPLAY_ONLY:
        raise ConfigError(f"tier {tier.kind.value}: {replay_only_message(tier.eviction)}; set eviction to one of them")
    names = [("eviction", tier.eviction, eviction_policy_names())]
    if tier.admission != "always":
        names.append(("admission", tier.admission, ["always", *admission_policy_names()]))
    names.append(("codec", tier.codec, [*codec_names(), "auto"]))
    for field, value, valid in names:
        if value not in valid:
            hint = f" (names are lower case: {value.lower()!r})" if value.lower() in valid else ""
            raise ConfigError(f"tier {tier.kind.value}: {field} = {value!r} is not known{hint}; "
                              f"set {field} to one of: {', '.join(valid)}")


def check_options(tier: TierConfig) -> None:
    try:
        params = inspect.signature(tier_class(tier.kind).__init__).parameters
    except KVStoreError as exc:
        raise ConfigError(f"tier {tier.kind.value}: {exc}") from exc
    valid = sorted(set(params) - {"self", "capacity_bytes", "path", "num_workers"})
    for key in tier.options:
        if key not in valid:
            raise ConfigError(f"tier {tier.kind.value}: options.{key} is not an option of this tier; "
                              f"valid options: {', '.join(valid) or 'none'}")


def check_compression(config: StoreConfig) -> None:
    valid = compression_policy_names()
    if config.compression not in valid:
        raise ConfigError(f"compression = {config.compression!r} is not known; set it to one of: {', '.join(valid)}")


def check_locks(config: StoreConfig) -> None:
    """A local tier directory held by another live kvstore process is refused now, before allocation."""
    for tier in config.tiers:
        if tier.kind in LOCAL_DIR_KINDS and tier.path and os.path.isdir(tier.path):
            pid = holder_pid(tier.path)
            if pid is not None:
                raise ConfigError(locked_message(f"tier {tier.kind.value}", tier.path, pid, lock_path(tier.path)))
