"""Demo data: deterministic, uneven shards, ids exactly 0..total-1 in every format."""

from __future__ import annotations

import hashlib
import io
import os

import numpy as np
import pytest

from dataflow.__main__ import main
from dataflow.demo import DemoSpec, make_demo, shard_sizes
from dataflow.errors import ConfigError
from dataflow.index.scan import build_index
from dataflow.readers import open_shard


def _digest(directory: str) -> str:
    h = hashlib.sha256()
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".dfidx"):
            with open(os.path.join(directory, name), "rb") as f:
                h.update(f.read())
    return h.hexdigest()


def test_uneven_sizes_are_seeded_and_bounded() -> None:
    spec = DemoSpec(shards=50, samples_per_shard=100, seed=7)
    sizes = shard_sizes(spec)
    assert sizes == shard_sizes(spec) and len(set(sizes)) > 10
    assert min(sizes) >= 25 and max(sizes) <= 175
    assert shard_sizes(DemoSpec(shards=3, samples_per_shard=100, uneven=False)) == [100] * 3
    assert sizes != shard_sizes(DemoSpec(shards=50, samples_per_shard=100, seed=8))


@pytest.mark.parametrize(("fmt", "kind"), [("arrow", "file"), ("arrow", "stream"),
                                           ("parquet", "file"), ("tar", "file")])
def test_ids_are_exactly_0_to_total_with_uneven_shards(tmp_path, fmt: str, kind: str) -> None:
    spec = DemoSpec(fmt=fmt, shards=4, samples_per_shard=30, image_shape=(3, 4, 4),
                    arrow_kind=kind)
    demo = make_demo(str(tmp_path), spec, progress=None)
    assert len(set(demo.sizes)) > 1
    index = build_index(str(tmp_path), cache_dir=str(tmp_path / "c"))
    assert index.sizes == demo.sizes
    ids, labels = [], []
    for url in index.shards:
        with open_shard(url, cache_dir=str(tmp_path / "c")) as r:
            b = r.read(0, len(r))
            ids.append(b["id"])
            labels.append(b["label"])
            assert b["image"].shape == (len(r), 3, 4, 4) and b["image"].dtype == np.uint8
            np.testing.assert_array_equal(b["image"][:, 0, 0, 0], b["id"] % 256)
            assert b["text"][0].startswith(f"sample {b['id'][0]} ")
    np.testing.assert_array_equal(np.concatenate(ids), np.arange(demo.total))
    np.testing.assert_array_equal(np.concatenate(labels), np.arange(demo.total) % 10)


@pytest.mark.parametrize("fmt", ["arrow", "parquet", "tar"])
def test_same_spec_same_bytes(tmp_path, fmt: str) -> None:
    spec = DemoSpec(fmt=fmt, shards=2, samples_per_shard=20, image_shape=(2,))
    make_demo(str(tmp_path / "a"), spec, progress=None)
    make_demo(str(tmp_path / "b"), spec, progress=None)
    assert _digest(str(tmp_path / "a")) == _digest(str(tmp_path / "b"))


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_only_on_a_terminal(tmp_path) -> None:
    spec = DemoSpec(shards=3, samples_per_shard=4, image_shape=(1,))
    tty = _Terminal()
    make_demo(str(tmp_path / "a"), spec, progress=tty)
    assert "3/3" in tty.getvalue() and "\r" in tty.getvalue()
    piped = io.StringIO()
    make_demo(str(tmp_path / "b"), spec, progress=piped)
    assert piped.getvalue() == ""


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"fmt": "csv"}, "fmt"), ({"shards": 0}, "shards"), ({"samples_per_shard": 0},
                                                         "samples_per_shard"),
    ({"image_shape": (3, 0)}, "image_shape"), ({"arrow_kind": "x"}, "arrow_kind"),
])
def test_spec_validation(kwargs, field: str) -> None:
    with pytest.raises(ConfigError, match=f"`{field}` must"):
        DemoSpec(**kwargs)


def test_cli_make_demo_and_read(tmp_path, capsys) -> None:
    out = str(tmp_path / "demo")
    assert main(["make-demo", out, "--format", "tar", "--shards", "3", "--samples-per-shard",
                 "10", "--even", "--image-shape", "2,2", "--seed", "4"]) == 0
    captured = capsys.readouterr()
    assert "3 shard(s), 30 samples" in captured.out and "\r" not in captured.err
    assert main(["read", out, "--batch-size", "7", "--cache-dir", str(tmp_path / "c")]) == 0
    assert "read: 30 samples" in capsys.readouterr().out
    assert main(["read", str(tmp_path / "nothing*")]) == 1
    assert "matches no shard" in capsys.readouterr().err


def test_cli_help_explains(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["make-demo", "--help"])
    text = capsys.readouterr().out
    assert "--uneven" in text and "--arrow-kind" in text and "0.25x" in text
