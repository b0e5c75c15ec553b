"""The torch baseline's datasets, written the way users commonly write them today.

* Arrow / Parquet shards: a map-style dataset. Each worker memory-maps the shards lazily and
  converts one row per ``__getitem__``; ``DataLoader`` samples indices and collates.
* WebDataset tar shards: a webdataset pipeline (shard list, deterministic shard shuffle,
  split by worker, tar parsing, sample shuffle buffer, decode, batching inside the workers),
  used with ``DataLoader(batch_size=None)``.

Both decode to the same batch as the dataflow client: fixed-size fields become tensors of
shape ``(batch, *shape)``; ``str`` fields become lists of ``str``.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import webdataset as wds
from torch.utils.data import Dataset, default_collate

from dataflow.batch import FieldSpec, Ragged, Schema
from dataflow.convert.tables import from_arrow
from dataflow.errors import ShardReadError
from dataflow.storage.sources import local_path

SHUFFLE_BUFFER = 1000
_NPY_SUFFIX = ".npy"


def open_table(url: str, fmt: str) -> pa.Table:
    """A whole shard as an Arrow table, memory-mapped where the format allows.

    Args:
        url: local shard path.
        fmt: ``arrow-file``, ``arrow-stream`` or ``parquet``.
    """
    path = local_path(url)
    if fmt == "parquet":
        return pq.read_table(path, memory_map=True)
    source = pa.memory_map(path)
    if fmt == "arrow-file":
        return pa.ipc.open_file(source).read_all()
    if fmt == "arrow-stream":
        return pa.ipc.open_stream(source).read_all()
    raise ShardReadError(url, f"the map-style baseline reads Arrow or Parquet, not {fmt}")


def _sample_value(column: np.ndarray | Ragged) -> object:
    if isinstance(column, Ragged):
        return column[0]
    return torch.from_numpy(np.array(column[0]))


class ArrowMapDataset(Dataset):
    """Map-style dataset over Arrow IPC or Parquet shards, one sample per ``__getitem__``.

    Tables are opened on first use in each process (after the DataLoader forks its workers),
    so workers do not share file handles.

    Args:
        shards: shard paths, dataset order.
        sizes: samples per shard.
        schema: the dataset's fields (from the dataflow index; gives Parquet images their
            shape).
        fmt: ``arrow-file``, ``arrow-stream`` or ``parquet``.
    """

    def __init__(
        self, shards: Sequence[str], sizes: Sequence[int], schema: Schema, fmt: str
    ) -> None:
        self.shards = tuple(shards)
        self.schema = schema
        self.fmt = fmt
        self._ends = np.cumsum(np.asarray(sizes, dtype=np.int64))
        self._tables: dict[int, pa.Table] = {}

    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, index: int) -> dict[str, object]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} out of range [0, {len(self)})")
        shard = int(np.searchsorted(self._ends, index, side="right"))
        row = index - (int(self._ends[shard - 1]) if shard else 0)
        table = self._tables.get(shard)
        if table is None:
            table = self._tables[shard] = open_table(self.shards[shard], self.fmt)
        batch = from_arrow(table.slice(row, 1), self.schema)
        return {name: _sample_value(column) for name, column in batch.items()}


def _decode_value(spec: FieldSpec, raw: bytes, member: str) -> object:
    if member.endswith(_NPY_SUFFIX):
        return np.load(io.BytesIO(raw), allow_pickle=False)
    if spec.ragged == "str":
        return raw.decode("utf-8")
    if spec.ragged == "bytes":
        return raw
    if spec.ragged is None and spec.shape == ():
        kind = np.dtype(spec.dtype).kind
        text = raw.decode("ascii").strip()
        return int(text) if kind in "iu" else float(text)
    raise ShardReadError(member, f"field {spec.name!r} ({spec}) has no webdataset decoding here")


class DecodeSample:
    """Decodes one webdataset sample (``{member suffix: bytes}``) by the dataset's schema.

    ``KEY.image.npy`` becomes field ``image`` via ``np.load`` (no pickle); ASCII scalars become
    ints or floats; ``str`` fields are decoded as UTF-8.
    """

    def __init__(self, schema: Schema) -> None:
        self.specs = {spec.name: spec for spec in schema}

    def __call__(self, sample: Mapping[str, object]) -> dict[str, object]:
        out: dict[str, object] = {}
        for member, raw in sample.items():
            if member.startswith("__"):
                continue
            name = member[: -len(_NPY_SUFFIX)] if member.endswith(_NPY_SUFFIX) else member
            spec = self.specs.get(name)
            if spec is None:
                raise ShardReadError(str(sample.get("__url__")),
                                     f"member {sample.get('__key__')}.{member} matches no field")
            out[name] = _decode_value(spec, raw, member)  # type: ignore[arg-type]
        return out


def collate_fields(samples: Sequence[Mapping[str, object]]) -> dict[str, object]:
    """``default_collate`` over the data fields (webdataset's ``__key__`` etc. left out)."""
    return default_collate(
        [{k: v for k, v in sample.items() if not k.startswith("__")} for sample in samples]
    )


def webdataset_pipeline(
    shards: Sequence[str], schema: Schema, *, batch_size: int, shuffle: bool, seed: int
) -> wds.DataPipeline:
    """The webdataset pipeline of the tar baseline, batching inside the workers.

    Args:
        shards: tar shard paths.
        schema: the dataset's fields (from the dataflow index), for decoding.
        batch_size: samples per batch (the last batch of each worker may be short).
        shuffle: shuffle shards (same order in every worker) and samples (buffer
            ``SHUFFLE_BUFFER``).
        seed: shuffle seed.
    """
    stages: list = [wds.SimpleShardList([local_path(u) for u in shards])]
    if shuffle:
        stages.append(wds.detshuffle(bufsize=len(shards), initial=len(shards), seed=seed))
    stages += [wds.split_by_worker, wds.tarfile_to_samples()]
    if shuffle:
        stages.append(wds.shuffle(SHUFFLE_BUFFER, initial=SHUFFLE_BUFFER // 10, seed=seed))
    stages += [
        wds.map(DecodeSample(schema)),
        wds.batched(batch_size, collation_fn=collate_fields, partial=True),
    ]
    return wds.DataPipeline(*stages)
