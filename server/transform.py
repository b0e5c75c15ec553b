"""Loading the optional per-batch transform (``--transform module:function``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from dataflow.batch import Batch
from dataflow.errors import ConfigError

Transform = Callable[[Batch], Batch]


def load_transform(spec: str) -> Transform:
    """Import ``module:function`` and return the function.

    Raises:
        ConfigError: the module cannot be imported or has no such callable.
    """
    module_name, _, func_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ConfigError(f"`transform` {spec!r}: cannot import {module_name!r}: "
                          f"{type(e).__name__}: {e}") from e
    func = getattr(module, func_name, None)
    if not callable(func):
        raise ConfigError(f"`transform` {spec!r}: {module_name!r} has no callable {func_name!r}")
    return func


def apply_transform(transform: Transform, spec: str, batch: Batch) -> Batch:
    """Run ``transform`` on ``batch`` and check that it returned a batch.

    Raises:
        TypeError: the transform returned something other than a dict.
    """
    out = transform(batch)
    if not isinstance(out, dict):
        raise TypeError(f"transform {spec!r} must return a dict batch. "
                        f"Found: {type(out).__name__}")
    return out
