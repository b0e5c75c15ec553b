"""Rows copied from addresses in many buffers (dataflow.readers.addressed): the same bytes
as slicing each buffer, in any order, for rows of any size, ragged rows both ways."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.readers import addressed
from dataflow.readers.addressed import int64_at, ragged_at, rows_at


def _buffers(seed: int, count: int = 9, least: int = 64) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, int(rng.integers(least, 4096)), dtype=np.uint8)
            for _ in range(count)]


@pytest.mark.parametrize("size", [1, 5, 8, 300])
@pytest.mark.parametrize("n", [0, 1, 40])
def test_rows_at_equal_slices_of_their_buffers(size: int, n: int) -> None:
    bufs = _buffers(size * 100 + n, least=size)
    rng = np.random.default_rng(n)
    which = rng.integers(0, len(bufs), n)
    starts = np.array([rng.integers(0, len(bufs[w]) - size + 1) for w in which.tolist()],
                      dtype=np.int64)
    bases = np.array([b.ctypes.data for b in bufs], dtype=np.int64)
    got = rows_at(bases[which] + starts, size)
    assert got.shape == (n, size) and got.flags.c_contiguous and got.flags.writeable
    for k, (w, a) in enumerate(zip(which.tolist(), starts.tolist(), strict=True)):
        assert got[k].tobytes() == bufs[w][a : a + size].tobytes()


def test_int64_at_reads_one_or_several_values_a_row() -> None:
    arrays = [np.arange(10, dtype=np.int64) * (i + 1) for i in range(3)]
    at = np.array([a.ctypes.data for a in arrays], dtype=np.int64)
    which, rows = np.array([2, 0, 1, 2]), np.array([9, 0, 4, 3])
    assert int64_at(at[which] + rows * 8).tolist() == [27, 0, 8, 9]
    pairs = int64_at(at[which] + rows // 2 * 16, 2)
    assert pairs.shape == (4, 2)
    assert pairs.tolist() == [[24, 27], [0, 1], [8, 10], [6, 9]]


@pytest.mark.parametrize("index_bytes", [addressed.RAGGED_INDEX_BYTES, 16],
                         ids=["by-byte-index", "row-by-row"])
def test_ragged_at_joins_rows_of_any_length(monkeypatch: pytest.MonkeyPatch,
                                            index_bytes: int) -> None:
    monkeypatch.setattr(addressed, "RAGGED_INDEX_BYTES", index_bytes)
    bufs = _buffers(7)
    rng = np.random.default_rng(3)
    which = rng.integers(0, len(bufs), 30)
    lengths = rng.integers(0, 40, 30)
    starts = np.array([rng.integers(0, len(bufs[w]) - z + 1)
                       for w, z in zip(which.tolist(), lengths.tolist(), strict=True)],
                      dtype=np.int64)
    bases = np.array([b.ctypes.data for b in bufs], dtype=np.int64)
    values, offsets = ragged_at(bases[which] + starts, lengths)
    want = b"".join(bufs[w][a : a + z].tobytes() for w, a, z in
                    zip(which.tolist(), starts.tolist(), lengths.tolist(), strict=True))
    assert values.tobytes() == want
    assert offsets.tolist() == [0, *np.cumsum(lengths).tolist()]
    empty, cuts = ragged_at(bases[:2], np.zeros(2, dtype=np.int64))
    assert len(empty) == 0 and cuts.tolist() == [0, 0, 0]
