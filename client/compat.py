"""torch's DataLoader arguments that dataflow's DataLoader does not take, each refused with an
error naming dataflow's equivalent (code written for torch passes them out of habit; a bare
``TypeError: unexpected keyword argument`` would not say what to do instead)."""

from __future__ import annotations

from collections.abc import Mapping

from dataflow.errors import ConfigError

EQUIVALENTS: dict[str, str] = {
    "dataset": "`servers` (the loader servers serve the dataset: dataflow-server --data ...)",
    "num_workers": "the servers' reader processes, `dataflow-server --workers N` (the trainer "
                   "process only receives batches)",
    "prefetch_factor": "`prefetch` (requests kept outstanding per server, or one per reader "
                       "of a server with more readers)",
    "persistent_workers": "nothing: the servers' reader processes live across epochs",
    "worker_init_fn": "a server `--transform` (it runs in the servers' reader processes)",
    "multiprocessing_context": "nothing: the trainer runs no worker processes",
    "sampler": "`shuffle` and `seed` (the epoch plan), `rank` and `world_size` (the ranks' "
               "shares)",
    "batch_sampler": "`batch_size`, `shuffle`, `seed` and `drop_last` (the epoch plan)",
    "generator": "`seed` (shared by every rank: each epoch's order is a function of it)",
    "pin_memory_device": "`device` (batches land on it from pinned memory)",
    "in_order": "nothing: batches always arrive in the plan's order",
}


def refuse_torch_arguments(given: Mapping[str, object]) -> None:
    """Refuse the keyword arguments ``given`` beyond dataflow's own.

    Raises:
        ConfigError: one of them is torch's, naming dataflow's equivalent.
        TypeError: one is neither torch's nor dataflow's (as Python says of any function).
    """
    for name in given:
        if name in EQUIVALENTS:
            raise ConfigError(f"`{name}` is an argument of torch's DataLoader, not of "
                              f"dataflow's: use {EQUIVALENTS[name]}")
    if given:
        raise TypeError(f"DataLoader() got an unexpected keyword argument {next(iter(given))!r}")
