"""The checks of a number given as a setting, for every part's settings objects: a positive
number, and a size in bytes written as a number or with a unit (`64GiB`, `1.5TB`).

Standard library only, so the manager, the tiers and the tools share it without pulling each other
in. NumPy's integer and float scalars count as numbers (they register as `numbers.Integral` and
`numbers.Real`); a bool never does.
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction

BYTE_UNITS = {
    "B": 1,
    "kB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KiB": 2**10,
    "MiB": 2**20,
    "GiB": 2**30,
    "TiB": 2**40,
}
"""Unit spellings as printed; parsing ignores case ("64gib" is 64 GiB)."""
_BY_CASE = {unit.upper(): unit for unit in BYTE_UNITS}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class SettingTypeError(TypeError, ValueError):
    """A setting that is not a number of the kind asked for: a TypeError, and a ValueError too, so
    callers that catch either for a bad setting catch it."""


def positive(name: str, value: object, *, integer: bool = False, unit: str = "") -> int | float:
    """`value` as an int (with `integer`) or a float, once it is finite and > 0.

    Raises SettingTypeError when it is no number of that kind (a bool, a string, None), ValueError
    when it is not > 0 (or not finite); both messages name `name`, then what was expected.
    """
    kind = numbers.Integral if integer else numbers.Real
    expected = "a positive int" if integer else "a positive number"
    if unit:
        expected += f" of {unit}"
    if isinstance(value, bool) or not isinstance(value, kind):
        raise SettingTypeError(f"{name} must be {expected}, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return int(value) if integer else float(value)


def parse_size(text: str, what: str) -> tuple[str, str]:
    """(number, unit) of `10000` (unit "") or `64GiB`; ValueError saying what `what` expects."""
    match = _SIZE.match(text)
    if match is None or not math.isfinite(float(match.group(1))):
        raise ValueError(f"got {text!r}, expected {what}")
    number, unit = match.groups()
    if unit and unit.upper() not in _BY_CASE:
        raise ValueError(f"got {text!r}: unit {unit!r} is not one of {', '.join(BYTE_UNITS)}")
    return number, _BY_CASE.get(unit.upper(), "")


def whole_bytes(text: str) -> int:
    """Bytes written `2097152` or `2MiB` (`4.1MB` is 4,100,000); ValueError unless a whole number
    of at least one byte."""
    number, unit = parse_size(text, "a whole number of bytes (2097152) or a size (2MiB)")
    size = Fraction(number) * BYTE_UNITS[unit or "B"]  # exact: 4.1MB is 4,100,000 bytes
    if size < 1 or size.denominator != 1:
        raise ValueError(f"got {text!r}, expected a whole number of bytes >= 1")
    return int(size)


def byte_size(name: str, value: object) -> int:
    """`value` as a positive whole number of bytes: an int, or a text such as `1073741824`, `64GiB`
    or `1.5TB` (a URL's query, a JSON configuration). Errors name `name`, as `positive`'s do."""
    if isinstance(value, str):
        try:
            return whole_bytes(value)
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    return positive(name, value, integer=True, unit="bytes, or a text such as '64GiB'")
