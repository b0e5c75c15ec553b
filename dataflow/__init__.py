"""dataflow's data plane: shard sources, readers, epoch plans, columnar batches, wire format.

This package never imports torch.
"""

from dataflow.batch import Batch, Column, FieldSpec, Ragged, Schema
from dataflow.errors import (
    ConfigError,
    DataflowError,
    DatasetMismatchError,
    InternalError,
    LoaderClosedError,
    ProtocolError,
    RemoteError,
    SchemaMismatchError,
    ServerStartError,
    ServerUnavailable,
    ShardReadError,
    SpecError,
    StateMismatchError,
)
from dataflow.plan import EpochSize, Range, epoch_size, global_plan, plan, split_batches

__all__ = [
    "Batch",
    "Column",
    "ConfigError",
    "DataflowError",
    "DatasetMismatchError",
    "EpochSize",
    "FieldSpec",
    "InternalError",
    "LoaderClosedError",
    "ProtocolError",
    "Ragged",
    "Range",
    "RemoteError",
    "Schema",
    "SchemaMismatchError",
    "ServerStartError",
    "ServerUnavailable",
    "ShardReadError",
    "SpecError",
    "StateMismatchError",
    "epoch_size",
    "global_plan",
    "plan",
    "split_batches",
]
