"""`load_checked_config`: the CLI's store config, checked before anything is allocated.

`kvstore stats` and `kvstore store-demo` open a store in their own process; this runs the same
start-up checks as `kvstore serve` (kvstore/preflight.py) and turns a failure into one line on
stderr and exit status 2, instead of a traceback after the arena was allocated. A tier capped at a
restart (kvstore/capacity_caps.py) comes back with the config, for `TieredStore(config, caps=caps)`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import typer

from kvstore.capacity_caps import CapacityCap, apply_caps
from kvstore.config import StoreConfig, default_cache_dir, load_config
from kvstore.errors import KVStoreError


def load_checked_config(path: Path | None, *, command: str,
                        before_checks: Callable[[StoreConfig], None] | None = None,
                        ) -> tuple[StoreConfig, list[CapacityCap]]:
    """The config at `path` (None: the default) with KVSTORE_* overrides, after `before_checks` and preflight,
    capped tiers at their effective capacity; and the caps."""
    from kvstore.preflight import check_machine

    try:
        config = load_config(path)
        if before_checks is not None:
            before_checks(config)
        caps = check_machine(config, creatable_under=default_cache_dir())
        from kvstore.store.config_checks import check_tier_settings  # loads torch: after the machine checks

        check_tier_settings(config)
    except KVStoreError as exc:
        typer.echo(f"kvstore {command}: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(2) from None
    return apply_caps(config, caps), caps
