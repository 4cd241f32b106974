"""One grammar for on/off settings (config files, environment variables, engine option maps)."""

from __future__ import annotations

from kvstore.errors import ConfigError

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(value: object, *, field: str) -> bool:
    """True or False from a bool, 0/1, or one of TRUE_WORDS / FALSE_WORDS (any case).

    Raises:
        ConfigError: anything else ("maybe", "2", ""), naming the field and the words accepted: a typo must not
            silently turn a setting off.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE_WORDS:
        return True
    if text in FALSE_WORDS:
        return False
    raise ConfigError(f"{field} = {value!r} is not on or off; write one of {', '.join(TRUE_WORDS)} "
                      f"or {', '.join(FALSE_WORDS)}")


def parse_bool_or_auto(value: object, *, field: str) -> bool | str:
    """`parse_bool`, or the string "auto"."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_bool(value, field=field)
    except ConfigError:
        raise ConfigError(f"{field} = {value!r}: use true, false or \"auto\"") from None
