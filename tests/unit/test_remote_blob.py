"""Remote bytes in cached blocks (an fsspec ``memory://`` file): reads across block
boundaries, spans, the streaming file, a cache smaller than the file and the one-pass copy."""

from __future__ import annotations

import os

import fsspec
import numpy as np
import pytest

from dataflow.storage import remotefile
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.remotefile import BLOCK_BYTES, BLOCKS_DIR, buffered, open_blob

URL = "memory://blob-test/f.bin"


@pytest.fixture
def data() -> bytes:
    raw = np.random.default_rng(0).integers(0, 256, int(2.5 * BLOCK_BYTES), np.uint8).tobytes()
    fsspec.filesystem("memory").pipe(URL, raw)
    try:
        yield raw
    finally:
        fsspec.filesystem("memory").rm(URL)


def test_reads_across_blocks_match_the_file(data: bytes, tmp_path) -> None:
    blob = open_blob(URL, RemoteConfig(), str(tmp_path))
    assert blob.size == len(data) and blob.blocks == 3
    for a, b in [(0, 10), (BLOCK_BYTES - 5, BLOCK_BYTES + 5), (10, len(data) + 99),
                 (2 * BLOCK_BYTES, 2 * BLOCK_BYTES)]:
        assert blob.read(a, b) == data[a:b]
    assert blob.fetched == len(data)
    assert blob.read_exact(7, 9) == data[7:9]
    with buffered(blob) as f:
        f.seek(BLOCK_BYTES - 3)
        assert f.read(6) == data[BLOCK_BYTES - 3 : BLOCK_BYTES + 3]
        assert f.tell() == BLOCK_BYTES + 3


def test_spans_are_back_to_back(data: bytes, tmp_path) -> None:
    blob = open_blob(URL, RemoteConfig(), str(tmp_path))
    starts = np.array([5, BLOCK_BYTES - 2, 2 * BLOCK_BYTES + 1, 5], dtype=np.int64)
    stops = starts + np.array([3, 4, 0, 3], dtype=np.int64)
    buf, where = blob.spans(starts, stops)
    assert where.tolist() == [0, 3, 7, 7]
    for a, b, w in zip(starts.tolist(), stops.tolist(), where.tolist(), strict=True):
        assert buf[w : w + b - a].tobytes() == data[a:b]


def test_a_cache_smaller_than_the_file_stays_bounded(data: bytes, tmp_path) -> None:
    blob = open_blob(URL, RemoteConfig(cache_bytes=BLOCK_BYTES), str(tmp_path))
    assert blob.read(0, len(data)) == data
    blocks = tmp_path / BLOCKS_DIR
    held = sum(os.path.getsize(blocks / n) for n in os.listdir(blocks) if n[0] != ".")
    assert held <= BLOCK_BYTES


def test_copy_to_writes_the_file_in_parts_and_leaves_the_cache_alone(data: bytes, tmp_path,
                                                                     monkeypatch) -> None:
    monkeypatch.setattr(remotefile, "COPY_PART", BLOCK_BYTES)  # 3 parts, the last a half
    blob = open_blob(URL, RemoteConfig(), str(tmp_path))
    assert blob.read(0, 1) == data[:1]  # block 0 cached: its part comes from the cache
    with open(tmp_path / "copy", "wb") as f:
        blob.copy_to(f)
    assert (tmp_path / "copy").read_bytes() == data
    assert blob.fetched == len(data)
    blocks = tmp_path / BLOCKS_DIR
    assert len([n for n in os.listdir(blocks) if n[0] != "."]) == 1
