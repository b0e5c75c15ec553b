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
    RequestTimeout,
    SchemaError,
    SchemaMismatchError,
    ServerStartError,
    ServerUnavailable,
    ShardChangedError,
    ShardReadError,
    SpecError,
    StaleIteratorError,
    StateMismatchError,
    TransformError,
)
from dataflow.plan import (
    Batches,
    EpochSize,
    Range,
    consumed,
    epoch_order,
    epoch_size,
    rank_batches,
)
from dataflow.shuffle import Shuffle

__all__ = [
    "Batch",
    "Batches",
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
    "RequestTimeout",
    "Schema",
    "SchemaError",
    "SchemaMismatchError",
    "Shuffle",
    "ServerStartError",
    "ServerUnavailable",
    "ShardChangedError",
    "ShardReadError",
    "SpecError",
    "StaleIteratorError",
    "StateMismatchError",
    "TransformError",
    "consumed",
    "epoch_order",
    "epoch_size",
    "rank_batches",
]
