"""`kvstore config show`: every field of the configuration in force, with where it came from."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from kvstore.cli.config_reference import config_reference_command
from kvstore.config_origins import FieldOrigin, explain_config, show, show_bytes

config_app = typer.Typer(no_args_is_help=True, help="Inspect the store configuration.")
config_app.command("reference")(config_reference_command)


@config_app.command("show")
def config_show_command(
    config: Annotated[Path | None, typer.Option("--config", "-c", help="TOML/YAML store config (none: the default)")] = None,
) -> None:
    """Print every configured or defaulted field, its value and its origin (default, file, env KVSTORE_*)."""
    from kvstore.config import read_config_file
    from kvstore.errors import KVStoreError

    try:
        _, rows = explain_config(config)
        raw = (read_config_file(config).get("service") or {}) if config is not None else {}
        rows += service_rows(raw, f"file {config}", os.environ)
    except KVStoreError as exc:
        typer.echo(f"kvstore config show: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(2) from None
    source = f"file {config}" if config is not None else "no file (the built-in default)"
    typer.echo(f"configuration: {source}, then KVSTORE_* environment overrides")
    name_width = max(len(row.name) for row in rows)
    value_width = min(48, max(len(row.value) for row in rows))
    for row in rows:
        typer.echo(f"{row.name:<{name_width}}  {row.value:<{value_width}}  {row.origin}")


def service_rows(raw: Mapping[str, Any], file_label: str, env: Mapping[str, str]) -> list[FieldOrigin]:
    """The daemon's [service] fields (read by `kvstore serve` only); tokens shown as set or not, never their value."""
    from service.config import service_config_from_dict

    service = service_config_from_dict(raw, env)
    rows = []
    for f in dataclasses.fields(service):
        value = getattr(service, f.name)
        origin = file_label if f.name in raw else "default"
        if f.name == "tenants":
            shown = ", ".join(t.name for t in value) or "(none)"
        elif f.name in ("admin_token", "metrics_token"):
            shown = "(set)" if value else "(none)"
            variable = raw.get(f"{f.name}_env") or f"KVSTORE_{f.name.upper()}"
            origin = origin if f.name in raw or not value else f"env {variable}"
        else:
            shown = show_bytes(value) if f.name.endswith("_bytes") else show(value)
        rows.append(FieldOrigin(f"service.{f.name}", shown, origin))
    return rows
