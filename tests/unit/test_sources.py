"""Dataset spec resolution: paths, directories, globs, braces, fsspec URLs."""

from __future__ import annotations

import os

import fsspec
import pytest

from dataflow.errors import SpecError
from dataflow.storage.sources import expand_braces, is_local, open_file, resolve


def _touch(root, *names: str) -> list[str]:
    out = []
    for name in names:
        path = os.path.join(str(root), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(name.encode())
        out.append(path)
    return out


def test_expand_braces_ranges_keep_width_and_lists_keep_order() -> None:
    assert expand_braces("a-{008..011}.tar") == [f"a-{i:03d}.tar" for i in range(8, 12)]
    assert expand_braces("{b,a}/x-{1..2}.tar") == ["b/x-1.tar", "b/x-2.tar", "a/x-1.tar",
                                                  "a/x-2.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]


def test_expand_braces_as_webdataset_steps_nesting_descent_literals() -> None:
    assert expand_braces("a-{0..10..5}.tar") == ["a-0.tar", "a-5.tar", "a-10.tar"]
    assert expand_braces("a-{000..020..10}.tar") == ["a-000.tar", "a-010.tar", "a-020.tar"]
    assert expand_braces("{x,y{1..2}}.tar") == ["x.tar", "y1.tar", "y2.tar"]
    assert expand_braces("a-{3..1}.tar") == ["a-3.tar", "a-2.tar", "a-1.tar"]
    # As in bash and webdataset: no comma or range is no brace group.
    assert expand_braces("a-{}.tar") == ["a-{}.tar"]
    assert expand_braces("a-{1}.tar") == ["a-{1}.tar"]
    assert expand_braces("a\\{1,2\\}.tar") == ["a{1,2}.tar"]


@pytest.mark.parametrize("spec", ["a-{1..2.tar", "a-{1,{2}.tar", "a-{{1,2}.tar"])
def test_expand_braces_rejects_unbalanced_braces(spec: str) -> None:
    with pytest.raises(SpecError, match="a-.*unbalanced braces"):
        expand_braces(spec)


def test_resolve_stepped_braces_and_a_typo_naming_a_missing_file(tmp_path) -> None:
    paths = _touch(tmp_path, *(f"s-{i:02d}.tar" for i in range(0, 12)))
    assert resolve(str(tmp_path / "s-{00..10..5}.tar")) == [paths[0], paths[5], paths[10]]
    with pytest.raises(SpecError, match="s-.tar does not exist"):
        resolve(str(tmp_path / "s-{00,}.tar"))


def test_resolve_directory_lists_shards_sorted_recursively(tmp_path) -> None:
    _touch(tmp_path, "b.tar", "a.parquet", "notes.txt", "sub/c.arrow", "d.tar.gz", "e.tgz")
    got = resolve(str(tmp_path))
    names = [os.path.relpath(p, tmp_path) for p in got]
    assert names == ["a.parquet", "b.tar", "d.tar.gz", "e.tgz", "sub/c.arrow"]
    assert all(os.path.isabs(p) for p in got)


def test_resolve_glob_brace_and_order_across_specs(tmp_path) -> None:
    paths = _touch(tmp_path, *[f"train-{i:06d}.tar" for i in range(5)], "val-0.tar")
    braced = resolve(str(tmp_path / "train-{000001..000003}.tar"))
    assert braced == paths[1:4]
    both = resolve([str(tmp_path / "val-*.tar"), str(tmp_path / "train-*.tar")])
    assert both == [paths[5], *paths[:5]]
    dup = resolve([str(tmp_path / "train-000002.tar"), str(tmp_path / "train-*.tar")])
    assert dup == [paths[2], paths[0], paths[1], paths[3], paths[4]]


def test_resolve_file_url_is_a_local_path(tmp_path) -> None:
    (path,) = _touch(tmp_path, "x.tar")
    assert resolve(f"file://{path}") == [path]
    assert is_local(f"file://{path}") and is_local(path) and not is_local("memory://x.tar")


def test_resolve_memory_url_glob_dir_and_brace() -> None:
    fs = fsspec.filesystem("memory")
    for i in range(3):
        fs.pipe(f"/resolve-test/d/s-{i}.tar", b"x")
    fs.pipe("/resolve-test/d/readme.md", b"x")
    try:
        want = [f"memory:///resolve-test/d/s-{i}.tar" for i in range(3)]
        assert resolve("memory://resolve-test/d") == want
        assert resolve("memory://resolve-test/d/*.tar") == want
        assert resolve("memory://resolve-test/d/s-{1..2}.tar") == want[1:]
        with open_file(want[0]) as f:
            assert f.read() == b"x"
    finally:
        fs.rm("/resolve-test", recursive=True)


@pytest.mark.parametrize("spec", ["missing-dir/", "*.nothing", "memory://nope/*.tar"])
def test_resolve_nothing_matched_names_the_spec(tmp_path, spec: str) -> None:
    full = spec if "://" in spec else str(tmp_path / spec)
    with pytest.raises(SpecError, match="matches no shard") as e:
        resolve(full)
    assert full in str(e.value)


def test_resolve_brace_naming_a_missing_file_is_an_error(tmp_path) -> None:
    _touch(tmp_path, "s-0.tar", "s-1.tar")
    with pytest.raises(SpecError, match="s-2.tar does not exist"):
        resolve(str(tmp_path / "s-{0..2}.tar"))


def test_resolve_empty_spec_list() -> None:
    with pytest.raises(SpecError):
        resolve([])
