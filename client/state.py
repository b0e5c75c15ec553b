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

A MixtureLoader's state (:func:`make_mixture_state`) is the same, counted in the mixture's
slots: ``mixture`` (its version, 1), ``epoch``, ``consumed`` (slots of the mixture epoch),
``samples_per_epoch``, ``weights`` (the integers in lowest terms of
:class:`~dataflow.mixture.Weights`), the plan fields, ``world_size`` and ``sources``: per
source its ``name``, ``fingerprint``, ``total`` and ``position`` (samples of its stream of
passes consumed: a function of the rest, checked on load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dataflow.checks import check_int
from dataflow.errors import DatasetMismatchError, StateMismatchError
from dataflow.mixture import Weights, last_epoch
from dataflow.shuffle import Shuffle

VERSION = 2
MIXTURE_VERSION = 1
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
    if "mixture" in state:
        raise StateMismatchError("state_dict is a MixtureLoader's (it has `mixture`); load it "
                                 "into a MixtureLoader of the same sources")
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


def make_mixture_state(*, epoch: int, consumed: int, samples_per_epoch: int, weights: Weights,
                       sources: Sequence[tuple[str, str, int]], plan: Mapping[str, Any],
                       world_size: int) -> dict[str, Any]:
    """A MixtureLoader's state dict (see the module); ``sources``: each one's name,
    fingerprint and total, in order."""
    positions = weights.taken(epoch * samples_per_epoch + consumed)
    return {"mixture": MIXTURE_VERSION, "epoch": epoch, "consumed": consumed,
            "samples_per_epoch": samples_per_epoch, "weights": list(weights.counts),
            "sources": [{"name": name, "fingerprint": fp, "total": total, "position": at}
                        for (name, fp, total), at in zip(sources, positions, strict=True)],
            **{k: plan[k] for k in PLAN_FIELDS}, "world_size": world_size}


def read_mixture_state(state: Mapping[str, Any], *, samples_per_epoch: int, weights: Weights,
                       sources: Sequence[tuple[str, str, int]],
                       plan: Mapping[str, Any]) -> tuple[int, int]:
    """Check a MixtureLoader's ``state`` against this one; returns ``(epoch, consumed)``.

    Raises:
        StateMismatchError: not a MixtureLoader state of this version, a field missing or
            malformed, another number of sources, other weights, ``samples_per_epoch`` or
            plan inputs (naming the field and both values), or source positions that do not
            follow from the rest.
        DatasetMismatchError: a source's data differs (naming the source).
    """
    if not isinstance(state, Mapping):
        raise StateMismatchError(f"state_dict must be a mapping. Found: {type(state).__name__}")
    if "mixture" not in state:
        raise StateMismatchError("state_dict is a DataLoader's (it has no `mixture`); a "
                                 "MixtureLoader resumes only its own")
    if state["mixture"] != MIXTURE_VERSION:
        raise StateMismatchError(f"state_dict `mixture` must be {MIXTURE_VERSION}. Found: "
                                 f"{state['mixture']!r} (a state from another release)")
    for name in ("epoch", "consumed", "samples_per_epoch", "weights", "sources", *PLAN_FIELDS):
        if name not in state:
            raise StateMismatchError(f"state_dict is missing `{name}`")
    theirs = state["sources"]
    if not isinstance(theirs, list) or len(theirs) != len(sources) or not all(
            isinstance(s, Mapping) and {"name", "fingerprint", "total", "position"} <= set(s)
            for s in theirs):
        raise StateMismatchError(f"state_dict `sources` must list {len(sources)} source(s) "
                                 f"with name, fingerprint, total and position. Found: "
                                 f"{theirs!r}"[:400])
    for k, (s, (name, fingerprint, total)) in enumerate(zip(theirs, sources, strict=True)):
        if s["fingerprint"] != fingerprint or s["total"] != total:
            raise DatasetMismatchError(f"state_dict source {k} ({s['name']!r}) was dataset "
                                       f"{s['fingerprint']} ({s['total']!r} samples); source "
                                       f"{k} ({name!r}) serves {fingerprint} ({total} samples)")
    for name, ours in (("samples_per_epoch", samples_per_epoch),
                       ("weights", list(weights.counts)), *((k, plan[k]) for k in PLAN_FIELDS)):
        if state[name] != ours or isinstance(state[name], bool) != isinstance(ours, bool):
            raise StateMismatchError(f"state_dict `{name}` is {state[name]!r} but this loader "
                                     f"has {ours!r}")
    epoch = check_int("epoch", state["epoch"], 0, last_epoch(samples_per_epoch),
                      error=StateMismatchError, of="the state_dict")
    consumed = check_int("consumed", state["consumed"], 0, error=StateMismatchError,
                         of="the state_dict")
    if consumed > samples_per_epoch:
        raise StateMismatchError(f"state_dict `consumed` must be <= {samples_per_epoch}. "
                                 f"Found: {consumed}")
    positions = weights.taken(epoch * samples_per_epoch + consumed)
    if [s["position"] for s in theirs] != list(positions):
        raise StateMismatchError(f"state_dict source positions {[s['position'] for s in theirs]}"
                                 f" do not follow from its epoch {epoch} and consumed "
                                 f"{consumed} ({list(positions)})")
    return epoch, consumed
