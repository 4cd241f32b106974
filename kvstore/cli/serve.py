"""`kvstore serve`: the sidecar daemon's command (service.daemon loads uvicorn and the store on run)."""

from __future__ import annotations

from service.daemon import serve_command

__all__ = ["serve_command"]
