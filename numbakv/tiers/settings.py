"""Settings objects built from a configuration's keys or a URL's query: every key is named.

A tier's settings are frozen dataclasses that check their own values when built
(`RedisSettings`, `DiskSettings`, `TierSettings`). Here is what they share: refusing an unknown or
missing key by name, and reading a value written as text (a URL's query) as the field's type.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, fields
from typing import Any, TypeVar
from urllib.parse import urlsplit

Settings = TypeVar("Settings")

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def field_names(cls: type) -> tuple[str, ...]:
    """The keys a settings dataclass takes."""
    return tuple(field.name for field in fields(cls))


def settings_from(cls: type[Settings], values: Mapping[str, Any], what: str) -> Settings:
    """`cls(**values)`, once every key is one of its fields and every required field is given;
    `what` names the settings in the message ("Redis tier")."""
    known = field_names(cls)
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ValueError(
            f"unknown {what} setting {unknown[0]!r}; known: {', '.join(sorted(known))}"
        )
    for field in fields(cls):
        required = field.default is MISSING and field.default_factory is MISSING
        if required and field.name not in values:
            raise ValueError(f"the {what} needs a {field.name} setting")
    return cls(**values)


def from_text(cls: type, name: str, text: str) -> Any:
    """The text of setting `name` of `cls` (a URL query's value) as the field's type: bool, int,
    float or str; the value's own checks are the settings object's. A field that takes a str among
    other kinds (`int | str`: a byte size such as `64GiB`) takes the text as it is."""
    kind = typing.get_type_hints(cls)[name]
    if isinstance(kind, types.UnionType):  # `float | None`: the first kind
        kind = str if str in typing.get_args(kind) else typing.get_args(kind)[0]
    if kind is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError(f"{name} must be true or false, got {text!r}")
    if kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            expected = "a whole number" if kind is int else "a number"
            raise ValueError(f"{name} must be {expected}, got {text!r}") from None
    return text


def redacted(url: object) -> str:
    """The URL with its password and query (which may hold one) hidden: what logs may show.
    Everything before the last @ is taken for the user and password, so a password holding a
    character a URL must escape (`/`, `?`, `#`) is hidden all the same."""
    if not isinstance(url, str):
        return repr(url)
    scheme, slashes, rest = url.partition("://")
    if "@" in rest:
        credentials, rest = rest.rsplit("@", 1)
        rest = f"{credentials.split(':', 1)[0]}:***@{rest}"
    return scheme + slashes + rest.split("?", 1)[0].split("#", 1)[0]


def refuse_unescaped_credentials(url: str) -> None:
    """Refuse a URL whose user or password holds a character a URL must escape: what follows it
    would be read as the URL's path or query, and shown in errors."""
    parts = urlsplit(url)
    if "@" in parts.path + parts.query + parts.fragment:
        raise ValueError(
            "the url's user or password holds a character a URL must escape: write / as %2F, "
            f"? as %3F, # as %23 and @ as %40 (got {redacted(url)!r})"
        )
