"""The one check of a positive number given as a setting, for every part's settings objects.

Standard library only, so the manager, the tiers and the tools share it without pulling each other
in. NumPy's integer and float scalars count as numbers (they register as `numbers.Integral` and
`numbers.Real`); a bool never does.
"""

from __future__ import annotations

import math
import numbers


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
