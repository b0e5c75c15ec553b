"""Where shard bytes live and how they are reached: local paths, fsspec URLs, object stores.

* :mod:`~dataflow.storage.sources`: dataset specs (paths, globs, braces, URLs) -> shard
  lists; whether a shard is local; opening a shard file;
* :mod:`~dataflow.storage.remote`: :class:`~dataflow.storage.remote.Remote`, every request to
  a remote store (storage options, ranged reads with retries), with
  :mod:`~dataflow.storage.throttle` (backoff, adaptive concurrency) and
  :mod:`~dataflow.storage.remoteerrors` (what went wrong, in one line);
* :mod:`~dataflow.storage.remotefile`: a remote shard's bytes, read in blocks through
  :mod:`~dataflow.storage.lru`, the local cache bounded in bytes;
* :mod:`~dataflow.storage.cache`: files derived from shards (uncompressed copies, indexes):
  the cache directory, a shard's identity, atomic writes.

Each module is imported by its own path. This package never imports pyarrow or torch.
"""
