"""Loading and running the optional per-batch transform (``--transform module:function``).

The public API a transform is written against is :mod:`dataflow.transform`.

Where the module is found: first on ``sys.path`` as usual (installed packages, ``PYTHONPATH``),
then in the transform directory (``--transform-path``, by default the directory the server
was started in). Only the transform's top-level module or package is looked for in that
directory: the directory is not put on ``sys.path``, so a file there never shadows anything
else (the server's own ``dataflow`` package included). A transform module that imports a
sibling file must be a package (relative imports) or have its directory on ``PYTHONPATH``.

``--transform module:NAME`` names a function (one stage) or a
:class:`~dataflow.transform.Stages` (a cacheable ``decode``, then ``augment``).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from dataflow.batch import Batch, Ragged, batch_len
from dataflow.errors import ConfigError, InternalError, TransformError
from dataflow.subset import unmatched
from dataflow.transform import Stages, TransformContext, takes_context


@dataclass(frozen=True)
class Transform:
    """A loaded transform.

    Attributes:
        spec: its ``module:function``.
        func: the function run on every batch (of a :class:`~dataflow.transform.Stages`: its
            ``augment``, run on the decoded batch), or None: none.
        with_context: whether it is called as ``func(batch, ctx)``
            (:func:`dataflow.transform.takes_context`).
        decode: a ``Stages``' decode stage, run before ``func``; None: a one-stage transform.
        identity: the decode stage's identity (:attr:`Stages.identity`), or empty.
    """

    spec: str
    func: Callable[..., Any] | None
    with_context: bool
    decode: Callable[[Batch], Batch] | None = None
    identity: str = ""


def _import(module_name: str, directory: str | None) -> ModuleType:
    """``module_name`` from ``sys.path``, else its top-level package from ``directory``."""
    top = module_name.partition(".")[0]
    if directory and top not in sys.modules and importlib.util.find_spec(top) is None:
        found = importlib.machinery.PathFinder.find_spec(top, [directory])
        if found is not None and found.loader is not None:
            module = importlib.util.module_from_spec(found)
            sys.modules[top] = module
            try:
                found.loader.exec_module(module)
            except BaseException:
                del sys.modules[top]
                raise
    return importlib.import_module(module_name)


def load_transform(spec: str, directory: str | None = None) -> Transform:
    """Import ``module:function`` (looking in ``directory`` too, see the module) and return it.

    Raises:
        ConfigError: the module cannot be imported or has no such callable.
    """
    module_name, _, func_name = spec.partition(":")
    where = f" or in {directory}" if directory else ""
    try:
        module = _import(module_name, directory)
    except ModuleNotFoundError as e:
        raise ConfigError(f"`transform` {spec!r}: no module {e.name!r} on sys.path{where}"
                          ) from e
    except Exception as e:
        raise ConfigError(f"`transform` {spec!r}: cannot import {module_name!r}: "
                          f"{type(e).__name__}: {e}") from e
    func = getattr(module, func_name, None)
    if isinstance(func, Stages):
        augment = func.augment
        return Transform(spec, augment, augment is not None and takes_context(augment),
                         func.decode, func.identity)
    if not callable(func):
        raise ConfigError(f"`transform` {spec!r}: {module_name!r} has no callable or Stages "
                          f"{func_name!r}")
    return Transform(spec, func, takes_context(func))


def decode_batch(transform: Transform, batch: Batch, ctx: TransformContext) -> Batch:
    """The decode stage of ``transform`` (which has one) run on ``batch`` (any samples of the
    batch ``ctx`` describes), checked as :func:`apply_transform` checks a result.

    Raises:
        TransformError: as :func:`apply_transform` (the message says ``decode``).
    """
    if transform.decode is None:
        raise InternalError(f"transform {transform.spec!r} has no decode stage")
    where = f"transform {transform.spec!r} (decode) on {ctx.describe()}"
    try:
        out = transform.decode(batch)
    except Exception as e:
        raise TransformError(f"{where}: {type(e).__name__}: {e}") from e
    return _checked(where, out, batch_len(batch), None)


def apply_transform(transform: Transform, batch: Batch, ctx: TransformContext,
                    columns: Sequence[str] | None = None) -> Batch:
    """Run ``transform`` on ``batch`` and check that it returned a batch of as many samples,
    holding the ``columns`` the client asked for (None: no such rule).

    Raises:
        TransformError: the transform raised (chained as the cause), or returned something
            other than a non-empty dict of columns (arrays of shape ``(n, ...)`` or
            ``Ragged``) of the batch's ``n`` samples, or no field of a name of ``columns``;
            names the transform and the batch (and the missing fields).
    """
    where = f"transform {transform.spec!r} on {ctx.describe()}"
    if transform.func is None:  # a Stages without augment: the decoded batch
        return _checked(where, batch, batch_len(batch), columns)
    try:
        out = transform.func(batch, ctx) if transform.with_context else transform.func(batch)
    except Exception as e:
        raise TransformError(f"{where}: {type(e).__name__}: {e}") from e
    return _checked(where, out, batch_len(batch), columns)


def _checked(where: str, out: object, n: int, columns: Sequence[str] | None) -> Batch:
    """``out``, a transform's result for a batch of ``n`` samples, checked (see
    :func:`apply_transform`)."""
    if not isinstance(out, dict):
        raise TransformError(f"{where}: must return a dict batch. Found: {type(out).__name__}")
    for name, col in out.items():
        if not (isinstance(col, Ragged) or isinstance(col, np.ndarray) and col.ndim >= 1):
            raise TransformError(f"{where}: field {name!r} must be a numpy array of shape "
                                 f"(n, ...) or a Ragged. Found: {type(col).__name__}")
        if len(col) != n:
            raise TransformError(f"{where}: field {name!r} has {len(col)} sample(s) for a "
                                 f"batch of {n}; a transform keeps every sample, in order")
    if not out:
        raise TransformError(f"{where}: returned a batch with no fields")
    missing = unmatched(columns or (), out)
    if missing:
        raise TransformError(f"{where}: removed field(s) {missing} that the client asked for "
                             f"(its `columns`); it returned {list(out)}")
    return out
