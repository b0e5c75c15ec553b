"""WebDataset tar shards: the reader, and the member index it reads through.

* :mod:`~dataflow.readers.tar.reader`: :class:`TarReader`, a shard's samples gathered by the
  index out of the memory-mapped tar, or fetched by ranged reads from a remote one
  (:mod:`~dataflow.readers.tar.remote`);
* :mod:`~dataflow.readers.tar.rows`: a local tar's index and map lent to a gather across
  shards (:mod:`dataflow.readers.across`);
* :mod:`~dataflow.readers.tar.options`: :class:`TarOptions`, the WebDataset conventions;
* :mod:`~dataflow.readers.tar.index`: the member index, where every field of every sample
  lies, built by :mod:`~dataflow.readers.tar.build` from one walk over the tar's headers
  (:mod:`~dataflow.readers.tar.walk`; ``.npy`` headers :mod:`~dataflow.readers.tar.npy`);
* :mod:`~dataflow.readers.tar.indexfile`: the index's binary file, kept and trusted as
  :mod:`~dataflow.readers.tar.indexcache` says.
"""

from dataflow.readers.tar.options import DEFAULT_OPTIONS, KEY_FIELD, TarOptions
from dataflow.readers.tar.reader import TarReader

__all__ = ["DEFAULT_OPTIONS", "KEY_FIELD", "TarOptions", "TarReader"]
