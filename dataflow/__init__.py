"""dataflow's data plane: shard sources, readers, epoch plans, columnar batches, wire format.

This package never imports torch.
"""

from dataflow.columns import Batch, Column, FieldSpec, Ragged, Schema
from dataflow.errors import (
    ConfigError,
    DataflowError,
    ProtocolError,
    RemoteError,
    SchemaMismatchError,
    ServerUnavailable,
    ShardReadError,
    SpecError,
)
from dataflow.plan import EpochSize, Range, epoch_size, global_plan, plan, split_batches

__all__ = [
    "Batch",
    "Column",
    "ConfigError",
    "DataflowError",
    "EpochSize",
    "FieldSpec",
    "ProtocolError",
    "Ragged",
    "Range",
    "RemoteError",
    "Schema",
    "SchemaMismatchError",
    "ServerUnavailable",
    "ShardReadError",
    "SpecError",
    "epoch_size",
    "global_plan",
    "plan",
    "split_batches",
]
