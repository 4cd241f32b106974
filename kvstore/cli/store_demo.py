"""`kvstore store-demo`: one long prompt through host, NVMe, drop and reload (torch loads when it runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def store_demo_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config")] = None,
    prompt_tokens: Annotated[int, typer.Option(help="Length of the long prompt")] = 8192,
) -> None:
    """Store a long prompt's KV, drop the host copies, reload it from disk, and show what happened."""
    from kvstore.cli.store_demo_run import run_store_demo

    run_store_demo(config, prompt_tokens)
