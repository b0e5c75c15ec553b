"""The one rule for integer arguments, and the check every config and function uses.

An integer is a Python ``int`` or anything that says it is one through ``__index__`` (numpy
and torch integers, 0-d integer arrays), but never a ``bool``, Python's or numpy's: ``True``
as a batch size is a mistake, not 1. A checked value comes back as a plain ``int``, so what
is stored or sent (JSON) is one.
"""

from __future__ import annotations

import operator

import numpy as np

from dataflow.errors import ConfigError, DataflowError


def as_int(value: object) -> int | None:
    """``value`` as an ``int`` when it is an integer (see the module), else None."""
    if type(value) is int:
        return value
    if isinstance(value, bool | np.bool_):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None


def int_rule(lo: int, hi: int | None = None) -> str:
    """How messages say "an integer in ``[lo, hi]``" (``hi`` None: no upper bound)."""
    return f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"


def check_int(name: str, value: object, lo: int = 0, hi: int | None = None, *,
              error: type[DataflowError] = ConfigError, of: str = "") -> int:
    """``value`` as an ``int``, checked to be an integer in ``[lo, hi]``.

    Args:
        name: the argument, field or flag, as the message names it.
        value: what was given.
        lo: the least value allowed.
        hi: the greatest value allowed (None: no upper bound).
        error: the class raised.
        of: what holds ``name``, when the message must say it (``"the state_dict"``).

    Raises:
        error: "`name` must be an integer >= lo. Found: value" (or "in [lo, hi]"; with
            ``of``: "`name` of the state_dict must be ...").
    """
    n = as_int(value)
    if n is None or n < lo or (hi is not None and n > hi):
        owner = f" of {of}" if of else ""
        raise error(f"`{name}`{owner} must be {int_rule(lo, hi)}. Found: {value!r}")
    return n
