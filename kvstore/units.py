"""Parse and print byte sizes: "4GiB", "512 MB", 1048576."""

from __future__ import annotations

import re

from kvstore.errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3, "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}


def parse_bytes(value: int | float | str, *, field: str = "size") -> int:
    """Bytes from an int or a string with a unit (KiB/MiB/GiB/TiB, KB/MB/GB/TB)."""
    if isinstance(value, bool):
        raise ConfigError(f"{field}: expected a size like '4GiB', got {value!r}")
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    if not match or match.group(2).lower() not in _UNITS:
        raise ConfigError(f"{field}: cannot parse size {value!r}; write e.g. '512MiB', '4GiB' or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def format_bytes(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"
