"""dataflow's data plane: shard sources, readers, epoch plans, columnar batches, wire format.

* :mod:`dataflow.storage`: dataset specs -> shards, and their bytes wherever they live
  (local files, object stores through a bounded block cache);
* :mod:`dataflow.readers`: a shard's samples as batches, one reader per format
  (:func:`~dataflow.readers.open_shard`; WebDataset tars in :mod:`dataflow.readers.tar`);
* :mod:`dataflow.convert`: Arrow -> batch, and which columns a dataset serves;
* :mod:`dataflow.index`: the dataset index, built by opening every shard once;
* :mod:`dataflow.shuffle`, :mod:`dataflow.plan`: an epoch's order and each rank's batches;
* :mod:`dataflow.batch`: columnar batches; :mod:`dataflow.subset` and
  :mod:`dataflow.transform`: what a server does to them for a client;
* :mod:`dataflow.wire`: the protocol; :mod:`dataflow.security`: CURVE keys and policy;
  :mod:`dataflow.exporter`: Prometheus metrics;
* :mod:`dataflow.errors`: every exception; :mod:`dataflow.checks`: integer arguments;
  :mod:`dataflow.demo`: demo datasets.

This package never imports torch.
"""

from dataflow.batch import Batch, Column, FieldSpec, Ragged, Schema
from dataflow.errors import (
    ConfigError,
    DataflowError,
    DatasetMismatchError,
    DecodeError,
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
    "DecodeError",
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
