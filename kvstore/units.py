"""The one size grammar: "4GiB", "512 MiB", "1.5TiB", "4GB" (decimal, said once), and print sizes back.

A size is a number and a unit. Binary units (KiB, MiB, GiB, TiB) are powers of 1024; KB/MB/GB/TB and
K/M/G/T are the decimal powers of 1000 they are everywhere else, and reading one is said once per
process (a log line with the bytes it meant), since the rest of a kvstore config speaks GiB. A bare
number is a byte count only under a key whose name says bytes (`max_body_bytes`, type `ByteCount`);
elsewhere (`capacity = 4`, type `Size`) it is refused with the fix, because it would silently mean 4 bytes.
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING

from kvstore.errors import ConfigError

logger = logging.getLogger(__name__)

BINARY_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
DECIMAL_UNITS = {"k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
                 "t": 1000**4, "tb": 1000**4}
UNITS_HELP = "units: B, KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB or K, M, G, T (powers of 1000)"
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*")
_said_decimal: set[tuple[str, str]] = set()


if TYPE_CHECKING:  # to a type checker both are ints; at run time, the types the config loader decodes
    Size = int
    ByteCount = int
else:
    class Size(int):
        """A config value that is a size with its unit ("64GiB", "4096B"): a bare number is refused."""

    class ByteCount(int):
        """A config value under a key that says bytes (`max_body_bytes`): a bare number is a byte count."""


class SizeError(ConfigError):
    """A value that is not a size; the text is the reason and the fix, without the setting's name."""


def parse_bytes(value: int | float | str, *, field: str = "size", require_unit: bool = False) -> int:
    """Bytes from a size with a unit, or from a bare byte count when `require_unit` is False.

    Args:
        value: "4GiB", "512 MiB", "4GB" (decimal), or an int/float/digit string (bytes).
        field: names the setting in errors and in the decimal-unit log line ("tier host: capacity").
        require_unit: refuse a bare number (a field whose name does not say bytes).

    Raises:
        ConfigError: not a size, an unknown unit ("4 GiBs"), or a bare number where a unit is needed.
    """
    try:
        return size_bytes(value, require_unit=require_unit, field=field)
    except SizeError as exc:
        raise ConfigError(f"{field} = {value!r}{exc}") from None


def size_bytes(value: object, *, require_unit: bool, field: str | None = None) -> int:
    """`parse_bytes` for the config loader: SizeError holds the reason only (the loader names the setting);
    a decimal size is said once, naming `field` when given, else the value."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise SizeError(f" is not a size; write e.g. '4GiB' ({UNITS_HELP})")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _SIZE.fullmatch(value)
        if not match:
            raise SizeError(f" is not a size; write e.g. '512MiB' or '4GiB' ({UNITS_HELP})")
        number, unit = float(match.group(1)), match.group(2)
    if unit == "" and require_unit:
        raise SizeError(f" has no unit (it would mean {_plain(number)} bytes); write e.g. {_suggest(number)} "
                        f"({UNITS_HELP})")
    key = unit.lower()
    if key in BINARY_UNITS or key == "":
        return int(number * BINARY_UNITS.get(key, 1))
    if key in DECIMAL_UNITS:
        nbytes = int(number * DECIMAL_UNITS[key])
        _say_decimal_once(field, str(value), nbytes)
        return nbytes
    raise SizeError(f": {unit!r} is not a size unit; write e.g. '{_plain(number)}GiB' ({UNITS_HELP})")


def _plain(number: float) -> str:
    """A number as a user writes it: 1474560, 1.5; never 1.47456e+06."""
    return str(int(number)) if number == int(number) else f"{number:.6f}".rstrip("0")


def _suggest(number: float) -> str:
    """What a bare number most likely meant: a small one a unit left off, a large one a byte count."""
    if number < 1024:
        return f"'{_plain(number)}GiB', or '{_plain(number)}B' if bytes are meant"
    size, power = number / 1024, 0
    while size >= 1024 and power < 3:
        size, power = size / 1024, power + 1
    return f"'{_plain(number)}B', or about '{size:.3g}{('KiB', 'MiB', 'GiB', 'TiB')[power]}'"


def _say_decimal_once(field: str | None, text: str, nbytes: int) -> None:
    if (field or "", text) in _said_decimal:
        return
    _said_decimal.add((field or "", text))
    logger.warning("%s%r is a decimal size: %s bytes = %s (for powers of 1024 write GiB, MiB, ...)",
                   f"{field} = " if field else "size ", text, f"{nbytes:,}", format_bytes(nbytes))


def format_bytes(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.1f} TiB"
