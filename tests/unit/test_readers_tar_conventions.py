"""WebDataset conventions of the tar reader: ``__key__`` and samples missing a field.

Tars are written by webdataset's TarWriter (a PAX header per member) and by Python's tarfile
(GNU long names, hard links).
"""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest
import webdataset as wds

from dataflow.errors import ConfigError, ShardReadError
from dataflow.readers import TarOptions, open_shard, read_ranges
from dataflow.readers.tar.index import FILL_INT

LONG = "d" * 120 + "/"


def _npy(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def _sample(i: int) -> dict[str, bytes]:
    return {"cls": f"{i}".encode(), "x.npy": _npy(np.full((2,), i + 1, dtype=np.float32)),
            "txt": f"text {i}".encode(), "bin": bytes([i]) * (i + 1)}


def _write(path: str, samples: list[tuple[str, dict[str, bytes]]]) -> str:
    with wds.TarWriter(path) as w:
        for key, fields in samples:
            w.write({"__key__": key, **fields})
    return path


def _keys(n: int) -> list[str]:
    return [f"{LONG if i % 3 == 0 else 'sub/'}{i:06d}" for i in range(n)]


def test_key_field_holds_every_sample_key_also_long_and_nested(tmp_path) -> None:
    keys = _keys(9)
    path = _write(str(tmp_path / "s.tar"), [(k, _sample(i)) for i, k in enumerate(keys)])
    with open_shard(path, tar=TarOptions(keys=True)) as r:
        assert r.schema[-1].name == "__key__" and r.schema[-1].ragged == "str"
        col = r.read(0, 9)["__key__"]
        assert [col[i] for i in range(9)] == keys
        some = r.read_many(np.array([2, 7]), np.array([4, 8]))["__key__"]
        assert [some[i] for i in range(len(some))] == [keys[2], keys[3], keys[7]]
        assert r.read(5, 6)["cls"].tolist() == [5]
    with open_shard(path) as r:
        assert "__key__" not in r.read(0, 2) and "__key__" not in {f.name for f in r.schema}


def test_key_of_a_sample_starting_with_a_gnu_long_name_or_a_hard_link(tmp_path) -> None:
    path = str(tmp_path / "gnu.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as t:
        for name in (LONG + "a.cls", "b.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            t.addfile(info, io.BytesIO(b"7"))
        link = tarfile.TarInfo("c.cls")
        link.type, link.linkname = tarfile.LNKTYPE, "b.cls"
        t.addfile(link)
    with open_shard(path, tar=TarOptions(keys=True)) as r:
        batch = r.read(0, 3)
        assert [batch["__key__"][i] for i in range(3)] == [LONG + "a", "b", "c"]
        assert batch["cls"].tolist() == [7, 7, 7]


def _gappy(tmp_path, name: str = "gappy.tar") -> tuple[str, list[str]]:
    """Ten samples; sample 3 lacks ``txt`` and ``x.npy``, sample 6 lacks ``cls`` and ``bin``."""
    samples = []
    for i in range(10):
        fields = _sample(i)
        if i == 3:
            del fields["txt"], fields["x.npy"]
        if i == 6:
            del fields["cls"], fields["bin"]
        samples.append((f"{i:04d}", fields))
    return _write(str(tmp_path / name), samples), [k for k, _ in samples]


def test_missing_field_error_is_damage_handled_per_on_error(tmp_path) -> None:
    path, _ = _gappy(tmp_path)
    with pytest.raises(ShardReadError, match=r"sample '0003' has members \['bin', 'cls'\], "
                                             r"most samples .* \(missing \['txt', 'x.npy'\]\)"):
        open_shard(path)
    with open_shard(path, on_error="skip") as r:
        assert len(r) == 8 and r.skipped == 2


def test_missing_field_skip_leaves_them_out_and_counts_them_whatever_on_error(tmp_path) -> None:
    path, _ = _gappy(tmp_path)
    with open_shard(path, tar=TarOptions(missing_field="skip")) as r:
        assert len(r) == 8 and r.skipped == 2
        assert r.read(0, 8)["cls"].tolist() == [0, 1, 2, 4, 5, 7, 8, 9]
        assert [s.message.endswith(m) for s, m in zip(
            r.skip_log, ("(missing ['txt', 'x.npy'])", "(missing ['bin', 'cls'])"), strict=True)
        ] == [True, True]
    assert os.path.exists(path + ".skip.dfidx")


def test_missing_field_fill_serves_every_sample_with_empty_values(tmp_path) -> None:
    path, keys = _gappy(tmp_path)
    with open_shard(path, tar=TarOptions(keys=True, missing_field="fill")) as r:
        assert len(r) == 10 and r.skipped == 0
        runs = np.array([[0, 0, 2], [1, 2, 5], [0, 5, 10]])  # a batch of shards: one sink
        for batch in (r.read(0, 10), r.read_many(np.array([0]), np.array([10])),
                      read_ranges(lambda _: r, runs)):
            assert batch["cls"].tolist() == [0, 1, 2, 3, 4, 5, FILL_INT, 7, 8, 9]
            assert batch["x"].dtype == np.float32 and batch["x"].shape == (10, 2)
            assert batch["x"][:, 0].tolist() == [1, 2, 3, 0, 5, 6, 7, 8, 9, 10]
            assert [batch["txt"][i] for i in range(10)] == [
                "" if i == 3 else f"text {i}" for i in range(10)]
            assert [batch["bin"][i] for i in range(10)] == [
                b"" if i == 6 else bytes([i]) * (i + 1) for i in range(10)]
            assert [batch["__key__"][i] for i in range(10)] == keys
    assert os.path.exists(path + ".fill.dfidx")
    # The fill index is never taken for another policy: the default still finds the gaps.
    with pytest.raises(ShardReadError, match="missing"):
        open_shard(path)
    with open_shard(path, tar=TarOptions(missing_field="fill")) as r:
        assert not r.index_built and r.read(3, 4)["txt"][0] == ""


def test_fill_never_hides_members_the_shard_does_not_have(tmp_path) -> None:
    samples = [(f"{i:04d}", _sample(i)) for i in range(6)]
    samples[2][1]["extra"] = b"?"
    path = _write(str(tmp_path / "extra.tar"), samples)
    with pytest.raises(ShardReadError, match=r"sample '0002' has members .*'extra'"):
        open_shard(path, tar=TarOptions(missing_field="fill"))


def test_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="`missing_field` must be one of"):
        TarOptions(missing_field="ignore")
