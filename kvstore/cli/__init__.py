"""The `kvstore` command line: the typer app (`app.py`) and one module per command."""

from kvstore.cli.app import app

__all__ = ["app"]
