"""Traces shipped with kvstore, by name, so `kvstore replay` and `kvstore plan` run from a clean clone.

    mooncake-sample  kvstore/data/mooncake_conversation_head.jsonl (first 2,000 requests of the
                     Mooncake conversation trace, Apache-2.0; kvstore/data/SOURCE.md)
    azure-sample     connector/engine/data/azure_conv_2023_head.csv (first 500 requests of the
                     Azure conversation trace 2023, CC-BY 4.0; that folder's SOURCE.md)

A path that exists is used as given; a bundled name is resolved to the installed file.
"""

from __future__ import annotations

from pathlib import Path

from kvstore.errors import ConfigError

_ROOT = Path(__file__).resolve().parent.parent  # site-packages (or the repo): kvstore/ and connector/ side by side
BUNDLED_TRACES = {
    "mooncake-sample": _ROOT / "kvstore" / "data" / "mooncake_conversation_head.jsonl",
    "azure-sample": _ROOT / "connector" / "engine" / "data" / "azure_conv_2023_head.csv",
}


def resolve_trace(path_or_name: str | Path) -> Path:
    """The trace file `path_or_name` names: an existing path, or a bundled trace's name."""
    path = Path(path_or_name)
    if path.exists():
        return path
    bundled = BUNDLED_TRACES.get(str(path_or_name))
    if bundled is not None and bundled.exists():
        return bundled
    names = ", ".join(BUNDLED_TRACES)
    raise ConfigError(f"trace {str(path_or_name)!r} is neither a file nor a bundled trace; "
                      f"give a Mooncake JSONL or Azure CSV path, or one of: {names}")
