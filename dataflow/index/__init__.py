"""The dataset index: every shard, its sample count and identity, and the one schema they share.

* :mod:`~dataflow.index.dataset`: :class:`DatasetIndex`, the index as data (JSON in and out),
  what servers and clients hold;
* :mod:`~dataflow.index.scan`: building it by opening every shard with the readers, from a
  dataset spec resolved to shards (Hugging Face ``save_to_disk`` layouts:
  :mod:`~dataflow.index.splits`);
* :mod:`~dataflow.index.cache`: whole indexes kept on disk, so a restarted server opens no
  shard.

Only :class:`DatasetIndex` is re-exported: ``scan`` and ``cache`` are imported by their own
paths, since they load the readers, which a client never needs.
"""

from dataflow.index.dataset import DatasetIndex

__all__ = ["DatasetIndex"]
