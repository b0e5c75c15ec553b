"""WebDataset tar reader on tars written by webdataset's TarWriter and by the `tar` CLI."""

from __future__ import annotations

import dataclasses
import io
import multiprocessing
import os
import shutil
import subprocess
import tarfile
import tempfile

import fsspec
import numpy as np
import pytest

from dataflow.batch import FieldSpec
from dataflow.demo import DemoSpec, demo_samples, make_demo
from dataflow.errors import ShardReadError
from dataflow.readers import TarReader, open_shard
from dataflow.readers.tar.index import field_of, gather_fixed, split_name
from dataflow.readers.tar.indexfile import load_tar_index
from dataflow.storage.cache import default_cache_dir

SPEC = DemoSpec(fmt="tar", shards=2, samples_per_shard=40, image_shape=(3, 4, 5), seed=1)
NOBODY = 65534


def _npy(a: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, a)
    return f.getvalue()


def _sample(i: int, shape: tuple[int, ...] = (2, 3)) -> dict[str, bytes]:
    """Member contents of sample ``i`` by extension."""
    return {
        "cls": f"{i * 3}\n".encode(),
        "image.npy": _npy(np.arange(np.prod(shape), dtype=np.int16).reshape(shape) + i),
        "txt": ("héllo " * (i % 4 + 1)).encode(),
        "jpg": bytes([i % 256]) * (i % 7),
    }


def _members(n: int, prefix: str = "") -> list[tuple[str, bytes]]:
    return [(f"{prefix}{i:06d}.{ext}", data) for i in range(n) for ext, data in _sample(i).items()]


def _cli_tar(root, members: list[tuple[str, bytes]], *, fmt: str = "gnu", gz: bool = False,
             name: str = "shard", links: dict[str, str] | None = None,
             options: tuple[str, ...] = ()) -> str:
    """Write ``members`` as files under ``root/src-NAME`` and pack them, in order, with `tar`.

    ``links`` maps a member to an earlier one it is hard-linked to.
    """
    src = os.path.join(str(root), "src-" + name)
    for member, data in members:
        path = os.path.join(src, member)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if links and member in links:
            os.link(os.path.join(src, links[member]), path)
            continue
        with open(path, "wb") as f:
            f.write(data)
    out = os.path.join(str(root), name + (".tar.gz" if gz else ".tar"))
    order = [m for m, _ in members]
    cmd = ["tar", "-czf" if gz else "-cf", out, f"--format={fmt}", *options, "-C", src, "--",
           *order]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def _check_cli_values(r, n: int) -> None:
    b = r.read(0, n)
    np.testing.assert_array_equal(b["cls"], np.arange(n) * 3)
    assert b["image"].dtype == np.int16 and b["image"].shape == (n, 2, 3)
    np.testing.assert_array_equal(b["image"][:, 1, 2], np.arange(n) + 5)
    assert [b["txt"][i] for i in range(n)] == ["héllo " * (i % 4 + 1) for i in range(n)]
    assert [b["jpg"][i] for i in range(n)] == [bytes([i % 256]) * (i % 7) for i in range(n)]


def _tar_offsets(path: str) -> dict[str, int]:
    """Header offset of every member, as Python's tarfile sees it."""
    with tarfile.open(path) as t:
        return {m.name: m.offset for m in t.getmembers()}


# --- names and codecs ---------------------------------------------------------------------

@pytest.mark.parametrize(("name", "want"), [
    ("a/b/000017.image.npy", ("a/b/000017", "image.npy")),
    ("000017.JPG", ("000017", "jpg")),
    ("x.y/k.txt", ("x.y/k", "txt")),
    (".hidden", None), ("noext", None), ("dir/.x.txt", None), ("k.", None),
])
def test_split_name(name: str, want) -> None:
    assert split_name(name) == want


@pytest.mark.parametrize(("ext", "want"), [
    ("image.npy", ("image", "npy")), ("npy", ("npy", "npy")), ("cls", ("cls", "int")),
    ("label", ("label", "int")), ("seg.id", ("seg", "int")), ("text", ("text", "str")),
    ("caption.txt", ("caption", "str")), ("jpg", ("jpg", "bytes")),
    ("seg.png", ("seg.png", "bytes")),
])
def test_field_of(ext: str, want) -> None:
    assert field_of(ext) == want


def test_gather_fixed_at_any_offsets_in_any_order() -> None:
    buf = np.arange(200, dtype=np.uint8)
    for offs in ([3, 13, 23, 33], [3, 50, 51, 120], [7], [120, 3, 51, 3], [195], []):
        got = gather_fixed(buf, np.array(offs, dtype=np.int64), 5)
        want = np.array([buf[o : o + 5] for o in offs], dtype=np.uint8).reshape(len(offs), 5)
        np.testing.assert_array_equal(got, want)
        assert got.flags.writeable and got.flags.c_contiguous


# --- TarWriter tars (PAX header per member) ----------------------------------------------

@pytest.fixture
def demo(tmp_path):
    return make_demo(str(tmp_path / "demo"), SPEC, progress=None)


def test_tarwriter_tar_values_and_schema(demo, tmp_path) -> None:
    with open_shard(demo.paths[1], cache_dir=str(tmp_path / "c")) as r:
        assert isinstance(r, TarReader)
        n = demo.sizes[1]
        assert len(r) == n and r.skipped == 0
        assert {f.name: f for f in r.schema} == {
            "id": FieldSpec("id", "int64"), "label": FieldSpec("label", "int64"),
            "image": FieldSpec("image", "uint8", (3, 4, 5)),
            "text": FieldSpec("text", "uint8", ragged="str"),
        }
        want = demo_samples(SPEC, 1, demo.sizes[0], n)
        b = r.read(0, n)
        np.testing.assert_array_equal(b["id"], want["id"])
        np.testing.assert_array_equal(b["label"], want["label"])
        np.testing.assert_array_equal(b["image"], want["image"])
        assert [b["text"][i] for i in range(n)] == list(want["text"])


def test_tarwriter_tar_ranges(demo, tmp_path, assert_ranges_match) -> None:
    with open_shard(demo.paths[0], cache_dir=str(tmp_path / "c")) as r:
        assert_ranges_match(r)
        empty = r.read(3, 3)
        assert empty["image"].shape == (0, 3, 4, 5) and len(empty["text"]) == 0
    r.close()
    with pytest.raises(ShardReadError, match="read after close"):
        r.read(0, 1)


# --- tars from the tar CLI ----------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["gnu", "ustar", "pax"])
def test_cli_tar_formats_with_long_names(tmp_path, fmt: str, assert_ranges_match) -> None:
    deep = "d" * 60 + "/" + "e" * 60 + "/"
    path = _cli_tar(tmp_path, _members(9, prefix=deep), fmt=fmt)
    with open_shard(path, cache_dir=str(tmp_path / "c")) as r:
        assert len(r) == 9
        _check_cli_values(r, 9)
        assert_ranges_match(r)


def test_cli_tar_gz_is_decompressed_once_into_cache_dir(tmp_path, assert_ranges_match) -> None:
    path = _cli_tar(tmp_path, _members(12), gz=True)
    cache = tmp_path / "cache"
    with open_shard(path, cache_dir=str(cache)) as r:
        assert len(r) == 12 and r.index_built
        _check_cli_values(r, 12)
        assert_ranges_match(r)
        assert r.index_path == path + ".dfidx"
    copies = [p for p in os.listdir(cache) if p.endswith(".tar")]
    assert len(copies) == 1
    with tarfile.open(cache / copies[0]) as t:
        assert len(t.getmembers()) == 48
    with open_shard(path, cache_dir=str(cache)) as r:
        assert not r.index_built
        _check_cli_values(r, 12)


def test_damaged_cached_copy_is_replaced(tmp_path) -> None:
    path = _cli_tar(tmp_path, _members(12), gz=True)
    cache = tmp_path / "cache"
    open_shard(path, cache_dir=str(cache)).close()
    (copy,) = [cache / p for p in os.listdir(cache) if p.endswith(".tar")]
    with open(copy, "r+b") as f:
        f.truncate(os.path.getsize(copy) // 2)
    with open_shard(path, cache_dir=str(cache)) as r:
        assert not r.index_built
        _check_cli_values(r, 12)


def test_memory_url_tar_is_copied_into_cache_dir(tmp_path, assert_ranges_match) -> None:
    path = _cli_tar(tmp_path, _members(6))
    url = "memory://tar-test/s.tar"
    with open(path, "rb") as f:
        fsspec.filesystem("memory").pipe(url, f.read())
    cache = tmp_path / "cache"
    try:
        with open_shard(url, cache_dir=str(cache)) as r:
            assert len(r) == 6
            _check_cli_values(r, 6)
            assert_ranges_match(r)
            assert os.path.dirname(r.index_path) == str(cache)
    finally:
        fsspec.filesystem("memory").rm(url)


def test_other_field_types(tmp_path, assert_ranges_match) -> None:
    members = []
    for i in range(4):
        k = f"s{i}"
        members += [(f"{k}.npy", _npy(np.array([i, i + 1], dtype=">i4"))),
                    (f"{k}.label", str(-i).encode()), (f"{k}.text", b"t" * i),
                    (f"{k}.seg.png", b"\x89PNG" + bytes(i))]
    with open_shard(_cli_tar(tmp_path, members), cache_dir=str(tmp_path / "c")) as r:
        assert r.schema == (FieldSpec("npy", "int32", (2,)), FieldSpec("label", "int64"),
                            FieldSpec("text", "uint8", ragged="str"),
                            FieldSpec("seg.png", "uint8", ragged="bytes"))
        b = r.read(1, 4)
        np.testing.assert_array_equal(b["npy"], [[1, 2], [2, 3], [3, 4]])
        assert b["npy"].dtype == np.dtype("=i4")
        np.testing.assert_array_equal(b["label"], [-1, -2, -3])
        assert b["text"][2] == "ttt" and b["seg.png"][0] == b"\x89PNG\x00"
        assert_ranges_match(r)  # the big-endian field is converted, also into a sink


def test_varying_member_sizes_use_the_general_gather(tmp_path, assert_ranges_match) -> None:
    members = []
    for i in range(7):
        members += [(f"{i:03d}.txt", b"x" * (300 * i)), (f"{i:03d}.image.npy", _npy(np.full(3, i)))]
    with open_shard(_cli_tar(tmp_path, members), cache_dir=str(tmp_path / "c")) as r:
        np.testing.assert_array_equal(r.read(0, 7)["image"][:, 0], np.arange(7))
        assert_ranges_match(r)


# --- index cache --------------------------------------------------------------------------

def test_index_cache_is_created_reused_and_rebuilt(tmp_path) -> None:
    path = _cli_tar(tmp_path, _members(8))
    cache = str(tmp_path / "cache")
    with open_shard(path, cache_dir=cache) as r:
        assert r.index_built and r.index_path == path + ".dfidx"
    before = os.stat(path + ".dfidx")
    with open_shard(path, cache_dir=cache) as r:
        assert not r.index_built and len(r) == 8
    after = os.stat(path + ".dfidx")
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    os.remove(path)
    shutil.rmtree(tmp_path / "src-shard")
    path = _cli_tar(tmp_path, _members(5))
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, before.st_mtime_ns + 10**9))
    with open_shard(path, cache_dir=cache) as r:
        assert r.index_built and len(r) == 5
        _check_cli_values(r, 5)
    assert os.stat(path + ".dfidx").st_ino != before.st_ino


def test_index_goes_to_cache_dir_when_refused_beside_the_shard(tmp_path) -> None:
    path = _cli_tar(tmp_path, _members(3))
    os.mkdir(path + ".dfidx")
    cache = tmp_path / "cache"
    with open_shard(path, cache_dir=str(cache)) as r:
        assert r.index_built and os.path.dirname(r.index_path) == str(cache)
    with open_shard(path, cache_dir=str(cache)) as r:
        assert not r.index_built and len(r) == 3


def _open_in_child(path: str, cache_dir: str, conn) -> None:
    if os.geteuid() == 0:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    try:
        with open_shard(path, cache_dir=cache_dir) as r:
            conn.send(("ok", r.index_path, len(r)))
    except BaseException as e:
        conn.send(("error", repr(e), 0))


@pytest.mark.timeout(60)
def test_index_goes_to_cache_dir_when_shard_directory_is_read_only() -> None:
    """A really read-only directory: root ignores permission bits, so as root the reader
    runs in a forked child that has dropped to user ``nobody``."""
    base = tempfile.mkdtemp(prefix="dataflow-ro-")
    try:
        os.chmod(base, 0o755)
        shards = os.path.join(base, "shards")
        os.mkdir(shards)
        path = _cli_tar(shards, _members(4))
        os.chmod(shards, 0o555)
        cache = os.path.join(base, "cache")
        os.mkdir(cache)
        if os.geteuid() == 0:
            os.chown(cache, NOBODY, NOBODY)
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_open_in_child, args=(path, cache, send))
        child.start()
        try:
            assert recv.poll(30), "child did not answer"
            status, where, n = recv.recv()
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
        assert status == "ok", where
        assert n == 4 and os.path.dirname(where) == cache
        assert not os.path.exists(path + ".dfidx")
    finally:
        os.chmod(os.path.join(base, "shards"), 0o755)
        shutil.rmtree(base)


def test_cached_index_must_fit_the_tar(tmp_path) -> None:
    path = _cli_tar(tmp_path, _members(3))
    open_shard(path).close()
    index = load_tar_index(path + ".dfidx", path)
    with open(path, "rb") as f:
        data = f.read()
    assert index.problem(data) is None
    end = int((index.offsets + index.sizes).max())
    assert index.problem(data[: end - 1]) == f"a field lies outside the tar's {end - 1} bytes"
    short = dataclasses.replace(index, sizes=index.sizes[:, :2])
    assert short.problem(data) == "array shapes do not agree with the schema"


def test_default_cache_dir_honours_xdg() -> None:
    assert default_cache_dir({"XDG_CACHE_HOME": "/x/y"}) == "/x/y/dataflow"
    assert default_cache_dir({}) == os.path.join(os.path.expanduser("~"), ".cache", "dataflow")


# --- bad input ----------------------------------------------------------------------------

def test_missing_shard_and_unknown_magic(tmp_path) -> None:
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(ShardReadError, match="nope.tar") as e:
        open_shard(missing)
    assert e.value.offset == 0
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"hello world" * 100)
    with pytest.raises(ShardReadError, match="unknown shard format") as e:
        open_shard(str(junk))
    assert e.value.shard == str(junk) and e.value.offset == 0


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_tar_raises_or_keeps_complete_samples(demo, tmp_path, gz: bool) -> None:
    path = demo.paths[0]
    cut = _tar_offsets(path)[f"{7:09d}.image.npy"] + 2000
    with open(path, "rb") as f:
        data = f.read(cut)
    bad = str(tmp_path / ("cut.tar.gz" if gz else "cut.tar"))
    with open(bad, "wb") as f:
        f.write(subprocess.run(["gzip", "-c"], input=data, capture_output=True,
                               check=True).stdout[:-30] if gz else data)
    cache = str(tmp_path / "c")
    with pytest.raises(ShardReadError, match="truncated") as e:
        open_shard(bad, cache_dir=cache)
    assert e.value.shard == bad and e.value.offset is not None
    with open_shard(bad, cache_dir=cache, on_error="skip") as r:
        assert len(r) == 7 and r.skipped == 1
        np.testing.assert_array_equal(r.read(0, 7)["id"], np.arange(7))
    with pytest.raises(ShardReadError, match="truncated"):
        open_shard(bad, cache_dir=cache)


def test_tar_without_end_marker_is_truncated(tmp_path) -> None:
    path = _cli_tar(tmp_path, _members(3))
    end = _tar_offsets(path)["000002.jpg"] + 1024
    with open(path, "r+b") as f:
        f.truncate(end)
    with pytest.raises(ShardReadError, match="end-of-archive") as e:
        open_shard(path)
    assert e.value.offset == end
    with open_shard(path, on_error="skip") as r:
        assert len(r) == 3 and r.skipped == 0


def test_corrupt_header_names_its_offset(tmp_path) -> None:
    path = _cli_tar(tmp_path, _members(5))
    where = _tar_offsets(path)["000003.cls"]
    with open(path, "r+b") as f:
        f.seek(where + 2)
        f.write(b"\xff")
    with pytest.raises(ShardReadError, match="checksum") as e:
        open_shard(path)
    assert e.value.offset == where
    with open_shard(path, on_error="skip") as r:
        _drop_sample(r, 5, 3)


@pytest.mark.parametrize("bad", [".hidden", "noext", "dir/.x.cls"])
def test_member_without_key(tmp_path, bad: str) -> None:
    members = _members(4)
    members.insert(6, (bad, b"?"))
    path = _cli_tar(tmp_path, members)
    with pytest.raises(ShardReadError, match="no key") as e:
        open_shard(path)
    assert e.value.shard == path and e.value.offset == _tar_offsets(path)[bad]
    with open_shard(path, on_error="skip") as r:
        assert len(r) == 4 and r.skipped == 1
        _check_cli_values(r, 4)


def _drop_sample(r, n: int, dropped: int) -> None:
    assert len(r) == n - 1 and r.skipped == 1
    np.testing.assert_array_equal(r.read(0, n - 1)["cls"],
                                  [3 * i for i in range(n) if i != dropped])


def test_npy_shape_mismatch_names_sample(tmp_path) -> None:
    members = _members(5)
    members[2 * 4 + 1] = ("000002.image.npy", _npy(np.zeros((3, 2), dtype=np.int16)))
    path = _cli_tar(tmp_path, members)
    with pytest.raises(ShardReadError, match="shape") as e:
        open_shard(path)
    assert e.value.index == 2 and e.value.shard == path
    with open_shard(path, on_error="skip") as r:
        _drop_sample(r, 5, 2)


def test_missing_and_extra_fields_name_sample(tmp_path) -> None:
    members = [m for m in _members(5) if m[0] != "000003.txt"]
    path = _cli_tar(tmp_path, members, name="missing")
    with pytest.raises(ShardReadError, match="sample 3") as e:
        open_shard(path)
    assert e.value.index == 3
    with open_shard(path, on_error="skip") as r:
        _drop_sample(r, 5, 3)
    members = _members(5)
    members.insert(5, ("000001.extra", b"!"))
    path = _cli_tar(tmp_path, members, name="extra")
    with pytest.raises(ShardReadError, match="extra") as e:
        open_shard(path)
    assert e.value.index == 1


def test_bad_integer_names_sample(tmp_path) -> None:
    members = _members(4)
    members[1 * 4] = ("000001.cls", b"one")
    path = _cli_tar(tmp_path, members)
    with pytest.raises(ShardReadError, match="not an ASCII integer") as e:
        open_shard(path)
    assert e.value.index == 1
    with open_shard(path, on_error="skip") as r:
        _drop_sample(r, 4, 1)


def test_duplicate_member_and_clashing_fields(tmp_path) -> None:
    members = _members(3)
    members.insert(5, ("000001.cls", b"7"))
    path = _cli_tar(tmp_path, members, name="dup", options=("--hard-dereference",))
    with pytest.raises(ShardReadError, match="duplicate") as e:
        open_shard(path)
    assert e.value.index == 1
    members = [("k.image.npy", _npy(np.zeros(2))), ("k.image", b"x")]
    with pytest.raises(ShardReadError, match="both map to field 'image'"):
        open_shard(_cli_tar(tmp_path, members, name="clash"))


def test_signed_header_checksum_and_non_ascii_names(tmp_path) -> None:
    path = _cli_tar(tmp_path, [("clé-1.cls", b"5"), ("clé-2.cls", b"6")])
    with open(path, "r+b") as f:
        block = bytearray(f.read(512))
        block[148:156] = b" " * 8
        signed = sum(b - 256 if b >= 128 else b for b in block)
        block[148:156] = f"{signed:06o}\0 ".encode()
        f.seek(0)
        f.write(block)
    with open_shard(path) as r:
        np.testing.assert_array_equal(r.read(0, 2)["cls"], [5, 6])


def test_hard_link_reads_the_linked_data(tmp_path) -> None:
    members = _members(3)
    members[2 * 4 + 3] = ("000002.jpg", b"")
    path = _cli_tar(tmp_path, members, links={"000002.jpg": "000001.jpg"})
    with tarfile.open(path) as t:
        assert t.getmember("000002.jpg").islnk()
    with open_shard(path) as r:
        jpg = r.read(0, 3)["jpg"]
        assert jpg[2] == jpg[1] == bytes([1])


def test_unsupported_member_type(tmp_path) -> None:
    path = _cli_tar(tmp_path, _members(2))
    link = tmp_path / "src-shard" / "000002.cls"
    os.symlink("000001.cls", link)
    subprocess.run(["tar", "-rf", path, "-C", str(tmp_path / "src-shard"), "000002.cls"],
                   check=True)
    with pytest.raises(ShardReadError, match="unsupported tar member type"):
        open_shard(path)


def test_object_npy_is_refused(tmp_path) -> None:
    f = io.BytesIO()
    np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    path = _cli_tar(tmp_path, [("k.x.npy", f.getvalue())])
    with pytest.raises(ShardReadError, match="object arrays"):
        open_shard(path)
