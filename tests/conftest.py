"""Fixtures shared across test layers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from dataflow.batch import Ragged


def _rows_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, Ragged):
            assert isinstance(y, Ragged) and x.kind == y.kind, name
            assert [x[i] for i in range(len(x))] == [y[i] for i in range(len(y))], name
        else:
            assert x.dtype == y.dtype and x.shape == y.shape, name
            np.testing.assert_array_equal(x, y, err_msg=name)


@pytest.fixture
def assert_ranges_match() -> Callable:
    """``check(reader)``: reads of assorted ranges equal the same rows of a full read."""

    def check(reader, seed: int = 0) -> None:
        n = len(reader)
        full = reader.read(0, n)
        rng = np.random.default_rng(seed)
        ranges = [(0, 0), (0, min(1, n)), (max(n - 1, 0), n), (0, n), (n // 3, n // 2)]
        ranges += [tuple(sorted(rng.integers(0, n + 1, size=2).tolist())) for _ in range(8)]
        for start, stop in ranges:
            part = reader.read(start, stop)
            want = {}
            for name, col in full.items():
                if isinstance(col, Ragged):
                    want[name] = Ragged(
                        col.values[col.offsets[start] : col.offsets[stop]],
                        col.offsets[start : stop + 1] - col.offsets[start], col.kind,
                    )
                else:
                    want[name] = col[start:stop]
            _rows_equal(part, want)

    return check
