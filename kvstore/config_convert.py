"""One config table to its typed config class: msgspec.convert, and a ConfigError naming the setting, the value and the fix.

Every config class (StoreConfig, TierConfig, ServiceConfig, TenantConfig, KVEventsConfig) is a frozen dataclass;
`convert` turns one table of a TOML/YAML file, with the environment's strings layered on, into one. msgspec reads
the types (strict=False: "8" is an int where an int is wanted, as environment variables need), `decode_units` the
size types of kvstore/units.py, and `loosened` what msgspec's lax mode does not: the on/off words of
kvstore/flags.py, comma lists ("nvme,pfs") and TOML inline tables in a string. The messages::

    tier host: capacity = '4 GiBs': 'GiBs' is not a size unit; write e.g. '4GiB' (units: B, KiB, ...)
    write_queue_depth = 'many': expected `int`, got `str`; write a whole number
    tier host: unknown keys ['colour']; valid: ['admission', 'capacity', ...]
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import msgspec
import tomllib
from msgspec import inspect

from kvstore.errors import ConfigError
from kvstore.flags import FALSE_WORDS, TRUE_WORDS, parse_bool
from kvstore.units import ByteCount, Size, SizeError, size_bytes

T = TypeVar("T")
FILE_KEYS = {"capacity_bytes": "capacity", "quota_bytes": "quota", "memory_bytes": "memory"}  # field -> its key in a file
FIELD_OF_KEY = {key: name for name, key in FILE_KEYS.items()}
_AT = re.compile(r"(?P<reason>.*?)(?: - at `\$(?P<path>.*)`)?", re.S)
_FIELD = re.compile(r"\.(\w+)(?P<rest>.*)", re.S)
_NAMES = {inspect.IntType: "a whole number", inspect.FloatType: "a number", inspect.BoolType: "true or false",
          inspect.StrType: "a string", inspect.AnyType: "a value"}


def convert(raw: Mapping[str, Any], cls: type[T], *, where: str = "", also_valid: Iterable[str] = ()) -> T:
    """`raw` (one table, keys as a file writes them) as a `cls`.

    Args:
        raw: values from TOML/YAML, strings from the environment, or objects of the field's type.
        cls: a config dataclass.
        where: what every setting's name starts with in errors ("tier host: ", "service.").
        also_valid: keys the caller took out of the table before, listed among the valid ones in errors.

    Raises:
        ConfigError: an unknown key (listing the valid ones), a value of the wrong type (naming the setting,
            the value and what to write), or what `cls.__post_init__` refuses.
    """
    fields = fields_of(cls)  # type: ignore[arg-type]  # a class is hashable
    unknown = sorted(key for key in raw if FIELD_OF_KEY.get(key, key) not in fields)
    if unknown:
        valid = sorted({*(FILE_KEYS.get(name, name) for name in fields), *also_valid})
        raise ConfigError(f"{where}unknown {'' if where else 'config '}keys {unknown}; valid: {valid}")
    data = {}
    for key, value in raw.items():
        name = FIELD_OF_KEY.get(key, key)
        data[name] = loosened(value, fields[name].type, f"{where}{key}")
    try:
        config = msgspec.convert(data, cls, strict=False, dec_hook=decode_units)
    except msgspec.ValidationError as exc:
        raise _named(exc, raw, fields, where) from None
    sizes = {name: _plain(getattr(config, name)) for name in data if _has_sizes(fields[name].type)}
    return dataclasses.replace(config, **sizes) if sizes else config  # type: ignore[type-var]


def _has_sizes(info: inspect.Type) -> bool:
    if isinstance(info, inspect.UnionType):
        return any(_has_sizes(t) for t in info.types)
    return isinstance(info, inspect.CustomType) or (isinstance(info, inspect.DictType) and _has_sizes(info.value_type))


def _plain(value: Any) -> Any:
    """A decoded size as a plain int (the size types are for decoding only: messages encode plain ints)."""
    if isinstance(value, Mapping):
        return {key: _plain(v) for key, v in value.items()}
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else value


@functools.cache
def fields_of(cls: type) -> dict[str, inspect.Field]:
    """A config dataclass's fields by name, with the types msgspec reads them as."""
    info = inspect.type_info(cls)
    assert isinstance(info, inspect.DataclassType), cls
    return {f.name: f for f in info.fields}


def decode_units(kind: type, value: Any) -> Any:
    """msgspec's dec_hook: the size types of kvstore/units.py (a `Size` needs its unit, a `ByteCount` does not)."""
    if kind is Size or kind is ByteCount:
        return kind(size_bytes(value, require_unit=kind is Size))
    raise NotImplementedError(f"no config decoder for {kind}")


def loosened(value: Any, info: inspect.Type, name: str) -> Any:
    """A string where a bool, list or table is wanted, read as one: an on/off word (kvstore/flags.py), a comma list
    ("nvme,pfs"), a TOML inline table ('{url = "redis://..."}'); anything else unchanged (msgspec reads "8" as 8)."""
    if not isinstance(value, str):
        return value
    kinds = info.types if isinstance(info, inspect.UnionType) else (info,)
    if any(isinstance(k, inspect.BoolType) for k in kinds) and value.strip().lower() in (*TRUE_WORDS, *FALSE_WORDS):
        return parse_bool(value, field=name)
    if any(isinstance(k, (inspect.ListType, inspect.VarTupleType)) for k in kinds):
        return [part.strip() for part in value.split(",") if part.strip()]
    if any(isinstance(k, inspect.DictType) for k in kinds):
        try:
            return tomllib.loads(f"table = {value}")["table"]
        except tomllib.TOMLDecodeError:
            raise ConfigError(f"{name} = {value!r} is not a table; write a TOML inline table, e.g. "
                              "{url = \"redis://127.0.0.1:6379/0\", prefix = \"kv\"}") from None
    return value


def describe(info: inspect.Type) -> str:
    """What a value of this type is, as the fix in an error says it."""
    if isinstance(info, inspect.UnionType):
        parts = [describe(t) for t in info.types if not isinstance(t, inspect.NoneType)]
        return " or ".join([", ".join(part.replace(" or ", ", ") for part in parts[:-1]), parts[-1]] if parts[:-1] else parts)
    if isinstance(info, inspect.EnumType):
        return "one of " + ", ".join(repr(member.value) for member in info.cls)
    if isinstance(info, inspect.LiteralType):
        return " or ".join(f'"{v}"' for v in info.values)
    if isinstance(info, (inspect.ListType, inspect.VarTupleType)):
        return f"a list, each {describe(info.item_type)}"
    if isinstance(info, inspect.DictType):
        return f"a table, each value {describe(info.value_type)}"
    if isinstance(info, inspect.CustomType) and info.cls is Size:
        return "a size with its unit, e.g. '4GiB' or '4096B'"
    if isinstance(info, inspect.CustomType) and info.cls is ByteCount:
        return "a byte count or a size, e.g. '256MiB'"
    return _NAMES.get(type(info), "a value of the documented form (docs/configuration.md)")


def _named(exc: msgspec.ValidationError, raw: Mapping[str, Any], fields: dict[str, inspect.Field],
           where: str) -> ConfigError:
    """msgspec's error as one line naming the setting (its key in the file), the value and the fix."""
    match = _AT.fullmatch(str(exc))
    assert match is not None
    reason, path = match["reason"], match["path"]
    cause = exc.__cause__
    field = _FIELD.fullmatch(path or "")
    if field is None:  # raised by __post_init__ (its message names the field), or a missing field
        if isinstance(cause, ConfigError):
            return cause
        return ConfigError(f"{where}{reason[:1].lower()}{reason[1:]}; add it (docs/configuration.md)")
    name = field[1]
    key = FILE_KEYS.get(name, name)
    value = raw.get(key)
    if isinstance(cause, SizeError):
        return ConfigError(f"{where}{key} = {value!r}{cause}")
    if reason.startswith("Expected `bool`"):
        parse_bool(value, field=f"{where}{key}")  # raises, naming the words it takes
    inside = f" (at {field['rest']})" if field["rest"] else ""
    return ConfigError(f"{where}{key} = {value!r}: {reason[:1].lower()}{reason[1:]}{inside}; "
                       f"write {describe(fields[name].type)}")
