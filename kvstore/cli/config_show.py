"""`kvstore config show`: every field of the configuration in force, with where it came from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

config_app = typer.Typer(no_args_is_help=True, help="Inspect the store configuration.")


@config_app.command("show")
def config_show_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config (none: the default)")] = None,
) -> None:
    """Print every configured or defaulted field, its value and its origin (default, file, env KVSTORE_*)."""
    from kvstore.config_origins import explain_config
    from kvstore.errors import KVStoreError

    try:
        _, rows = explain_config(config)
    except KVStoreError as exc:
        typer.echo(f"kvstore config show: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(2) from None
    source = f"file {config}" if config is not None else "no file (the built-in default)"
    typer.echo(f"configuration: {source}, then KVSTORE_* environment overrides")
    name_width = max(len(row.name) for row in rows)
    value_width = min(48, max(len(row.value) for row in rows))
    for row in rows:
        typer.echo(f"{row.name:<{name_width}}  {row.value:<{value_width}}  {row.origin}")
