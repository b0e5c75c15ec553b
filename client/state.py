"""The DataLoader's resume state: a versioned dict of a few scalars, built and checked here.

The state is global, not per rank: in synchronous data-parallel training every rank has
yielded the same number of batches, so the consumed part of an epoch is a prefix of its global
order (:mod:`dataflow.plan`) of ``consumed`` samples. A state saved by any rank of a job of
``W`` ranks is loaded by every rank of a job of any size ``W'``; the new job reads the rest of
the epoch, every remaining sample exactly once.

Version 2 fields: ``version``, ``epoch``, ``consumed`` (samples of the epoch's global order,
``total`` once the epoch is complete), ``total``, ``fingerprint`` (the dataset's content
identity) and the plan inputs that must match (``seed``, ``batch_size``, the
:class:`~dataflow.shuffle.Shuffle`'s ``shuffle``, ``shuffle_window``, ``block_size`` and
``window``, ``drop_last``). ``world_size`` records the size of the job that saved it; it need
not match. Every field is the same on every rank of
that job (a state has no ``rank``; one saved by an earlier release with a ``rank`` loads the
same), so any rank's state may be saved.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dataflow.checks import check_int
from dataflow.errors import DatasetMismatchError, StateMismatchError
from dataflow.shuffle import Shuffle

VERSION = 2
PLAN_FIELDS = ("seed", "batch_size", *Shuffle().fields(), "drop_last")


def make_state(*, epoch: int, consumed: int, total: int, fingerprint: str,
               plan: Mapping[str, Any], world_size: int) -> dict[str, Any]:
    """The state dict (plain Python scalars, JSON- and ``torch.save``-friendly; identical on
    every rank)."""
    return {"version": VERSION, "epoch": epoch, "consumed": consumed, "total": total,
            "fingerprint": fingerprint, **{k: plan[k] for k in PLAN_FIELDS},
            "world_size": world_size}


def read_state(state: Mapping[str, Any], *, total: int, fingerprint: str,
               plan: Mapping[str, Any]) -> tuple[int, int]:
    """Check ``state`` against this loader; returns ``(epoch, consumed)``.

    Raises:
        StateMismatchError: not a state dict of this version, a field missing or malformed,
            or a plan input differs (naming the field and both values).
        DatasetMismatchError: the state was saved on another dataset.
    """
    if not isinstance(state, Mapping):
        raise StateMismatchError(f"state_dict must be a mapping. Found: {type(state).__name__}")
    if state.get("version") != VERSION:
        raise StateMismatchError(f"state_dict `version` must be {VERSION}. Found: "
                                 f"{state.get('version')!r} (a state from another release)")
    for name in ("epoch", "consumed", "total", "fingerprint", *PLAN_FIELDS):
        if name not in state:
            raise StateMismatchError(f"state_dict is missing `{name}`")
    if state["fingerprint"] != fingerprint or state["total"] != total:
        raise DatasetMismatchError(f"state_dict was saved on dataset {state['fingerprint']} "
                                   f"({state['total']!r} samples); the servers serve "
                                   f"{fingerprint} ({total} samples)")
    for name in PLAN_FIELDS:
        theirs, ours = state[name], plan[name]
        if theirs != ours or isinstance(theirs, bool) != isinstance(ours, bool):
            raise StateMismatchError(f"state_dict `{name}` is {theirs!r} but this loader "
                                     f"has {ours!r}")
    epoch, consumed = (check_int(name, state[name], 0, error=StateMismatchError,
                                 of="the state_dict") for name in ("epoch", "consumed"))
    if consumed > total:
        raise StateMismatchError(f"state_dict `consumed` must be <= {total}. Found: {consumed}")
    return epoch, consumed
