"""Arrow -> columnar batch: which columns a dataset serves, and how Arrow data becomes them.

* :mod:`~dataflow.convert.columns`: :class:`~dataflow.convert.columns.ReadOptions` (column
  selection, nulls, dictionaries, decimals, hive partitions), what the user chooses and the
  index found; no pyarrow, so the server's flags and the index use it freely;
* :mod:`~dataflow.convert.tables`: an Arrow table or record batch -> a batch
  (:func:`~dataflow.convert.tables.from_arrow`), its schema and census, through
* :mod:`~dataflow.convert.arrowtypes` (how each Arrow type becomes batch fields) and
  :mod:`~dataflow.convert.arrowdata` (how a leaf's data becomes them).

Each module is imported by its own path, so importing this package loads no pyarrow: only
``tables``, ``arrowtypes`` and ``arrowdata`` do, and only the Arrow and Parquet readers import
them.
"""
