"""bench startup's pure parts: the shards it writes, its medians and its table rows."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.bench.startup import SCENARIOS, StartupConfig, format_rows, summarize, write_shards
from dataflow.errors import ConfigError
from dataflow.index.scan import build_index
from dataflow.readers import open_shard


def test_shards_hold_every_id_once(tmp_path) -> None:
    paths = write_shards(str(tmp_path / "s"), 3, 5)
    assert write_shards(str(tmp_path / "s"), 3, 5) == paths
    index = build_index(paths, cache_dir=str(tmp_path / "c"))
    assert index.sizes == (5, 5, 5)
    ids = []
    for p in paths:
        with open_shard(p) as r:
            batch = r.read(0, len(r))
            ids += batch["id"].tolist()
            np.testing.assert_array_equal(batch["x"][:, 0], batch["id"].astype(np.float32))
    assert ids == list(range(15))


def test_summary_and_rows() -> None:
    runs = {s: [{"ready_s": 1.0 + i, "first_batch_s": 2.0 + i, "index_cache": "hit",
                 "index_s": 0.1, "main_to_ready_s": 0.5} for i in range(3)] for s in SCENARIOS}
    runs["torch+webdataset, new process"] = [
        {"ready_s": None, "first_batch_s": 4.0 * (i + 1), "index_cache": None} for i in range(3)]
    summary = summarize(runs)
    assert summary["cold"]["ready_s"] == 2.0 and summary["cold"]["first_batch_s"] == 3.0
    assert summary["torch+webdataset, new process"]["ready_s"] is None
    rows = format_rows(1000, summary)
    assert rows[0] == "| 1000 | cold | 2.00 | 3.00 | 0.10 | 0.50 | 0.38x |"
    assert rows[-1] == "| 1000 | torch+webdataset, new process | - | 8.00 | - | - | 1.00x |"


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="`repeats` must be an integer >= 1. Found: 0"):
        StartupConfig(repeats=0)
    with pytest.raises(ConfigError, match="`shard_counts` must be positive"):
        StartupConfig(shard_counts=())
