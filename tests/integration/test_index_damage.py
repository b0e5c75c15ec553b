"""Damage found while the dataset index is built, through a real server and DataLoader.

For each kind of damage the test destroys a known set of samples. Under ``--on-error raise``
the index refuses the shard, naming it and where; under ``skip`` every other sample arrives
once per epoch and the lost ones are counted: in the server's log, its STATS and
``dataflow_skipped_samples_total`` (once), and in ``stats()["skipped"]`` (per epoch)."""

from __future__ import annotations

import os
import re
import tarfile
import zlib
from collections import Counter
from collections.abc import Callable

import pyarrow as pa
import pytest
from srvtools import RawClient, scrape, wait_for

from dataflow.client import DataLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ServerUnavailable, ShardReadError
from dataflow.index.scan import build_index

SHARDS = 3


def _demo(root: str, fmt: str, per_shard: int, kind: str = "file") -> list[str]:
    spec = DemoSpec(fmt=fmt, shards=SHARDS, samples_per_shard=per_shard, uneven=False,
                    image_shape=(3, 8, 8), arrow_kind=kind)
    return [str(p) for p in make_demo(root, spec, progress=None).paths]


def _members(path: str) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as t:
        return {m.name: m for m in t.getmembers()}


def _key(i: int) -> str:
    return f"{i:09d}"  # the demo's tar keys: the sample id


class Damaged:
    """A dataset with one damaged shard: its paths, that shard, the ids lost, and what the
    ``raise`` error says (a regex)."""

    def __init__(self, paths: list[str], victim: str, lost: set[int], raised: str) -> None:
        self.paths, self.victim, self.lost, self.raised = paths, victim, lost, raised


def truncated_tar(root: str) -> Damaged:
    """Cut in the middle of the last sample's image: that sample is lost."""
    per = 20
    paths = _demo(root, "tar", per)
    victim, last = paths[1], 2 * per - 1
    image = _members(victim)[f"{_key(last)}.image.npy"]
    os.truncate(victim, image.offset_data + image.size // 2)
    return Damaged(paths, victim, {last}, r"byte offset \d+\): truncated tar")


def cut_tar_gz(root: str) -> Damaged:
    """A gzip stream that ends where its tar is in the middle of the last sample's image
    (compressed up to there with a full flush, the rest of the stream cut off)."""
    per = 20
    paths = _demo(root, "tar", per)
    tar, last = paths[1], 2 * per - 1
    image = _members(tar)[f"{_key(last)}.image.npy"]
    with open(tar, "rb") as f:
        raw = f.read()
    gz = zlib.compressobj(wbits=31)
    victim = tar + ".gz"
    with open(victim, "wb") as f:
        f.write(gz.compress(raw[: image.offset_data + image.size // 2]))
        f.write(gz.flush(zlib.Z_FULL_FLUSH))
    os.unlink(tar)
    paths[1] = victim
    return Damaged(paths, victim, {last}, r"byte offset \d+\): truncated tar")


def broken_npy(root: str) -> Damaged:
    """The ``.npy`` magic of two samples' images overwritten, the shard's first among them."""
    per = 20
    paths = _demo(root, "tar", per)
    victim = paths[1]
    members = _members(victim)
    lost = {per, per + 5}
    with open(victim, "r+b") as f:
        for i in lost:
            f.seek(members[f"{_key(i)}.image.npy"].offset_data)
            f.write(b"NOTNPY")
    return Damaged(paths, victim, lost, r"sample 0, byte offset \d+\): field 'image': not a .npy")


def truncated_arrow_stream(root: str) -> Damaged:
    """200 rows per shard in record batches of 128 and 72; the stream cut in the second."""
    per = 200
    paths = _demo(root, "arrow", per, kind="stream")
    victim = paths[1]
    with open(victim, "rb") as f:
        src = pa.BufferReader(f.read())
    reader = pa.ipc.open_stream(src)
    reader.read_next_batch()
    start = src.tell()
    assert reader.read_next_batch().num_rows == 72
    os.truncate(victim, (start + src.tell()) // 2)
    return Damaged(paths, victim, set(range(per + 128, 2 * per)),
                   r"record batch 1 of the stream is unreadable: its 72 row\(s\) are lost")


def zero_byte_tar(root: str) -> Damaged:
    """A zero-byte ``.tar`` among the shards (a failed write): no sample to lose, but the
    shard is damaged."""
    paths = _demo(root, "tar", 20)
    victim = os.path.join(root, "train-000001a.tar")
    open(victim, "wb").close()
    return Damaged([*paths, victim], victim, set(), r"byte offset 0\): empty file \(zero bytes\)")


KINDS: dict[str, Callable[[str], Damaged]] = {
    "truncated-tar": truncated_tar, "cut-tar-gz": cut_tar_gz, "broken-npy": broken_npy,
    "truncated-arrow-stream": truncated_arrow_stream, "zero-byte-tar": zero_byte_tar,
}


@pytest.mark.parametrize("kind", KINDS)
def test_raise_refuses_the_damaged_shard_naming_it(tmp_path, kind: str) -> None:
    d = KINDS[kind](str(tmp_path / "d"))
    with pytest.raises(ShardReadError) as e:
        build_index(d.paths, cache_dir=str(tmp_path / "c"))
    assert e.value.shard == d.victim
    assert re.search(d.raised, str(e.value)), str(e.value)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("kind", KINDS)
def test_skip_counts_every_sample_lost_at_indexing(servers, tmp_path, kind: str) -> None:
    d = KINDS[kind](str(tmp_path / "d"))
    name, k = os.path.basename(d.victim), len(d.lost)
    server = servers(d.paths, extra_args=["--on-error", "skip", "--metrics-port", "0",
                                          "--cache-dir", str(tmp_path / "c")])
    total = server.ready["samples"] + k
    with DataLoader(server.endpoint, batch_size=16, rank=0, world_size=1, timeout=30,
                    read_ahead=False) as dl:
        for epoch in (1, 2):
            ids = Counter(i for batch in dl for i in batch["id"].tolist())
            assert set(ids) == set(range(total)) - d.lost and set(ids.values()) == {1}
            assert dl.stats()["skipped"] == epoch * k, "lost from every epoch, counted in each"
    with DataLoader(server.endpoint, batch_size=16, rank=1, world_size=2, timeout=30,
                    read_ahead=False) as dl:
        assert sum(1 for _ in dl) == len(dl)
        assert dl.stats()["skipped"] == 0, "rank 0 counts them: summed over ranks, once"
    key = ("dataflow_skipped_samples_total", (("shard", name),))
    wait_for(lambda: scrape(server.ready["metrics_port"]).get(key, 0) == k, 10,
             f"{k} skipped samples of {name} in /metrics")
    probe = RawClient(server.endpoint)
    try:
        stats = probe.stats()
    finally:
        probe.close()
    assert stats["skipped_samples"] == k
    assert stats["skipped_per_shard"] == ([d.paths.index(d.victim), k] if k else [])
    log = server.stderr_tail(50_000)
    assert f"{name}: {k} sample(s) skipped, 1 damage record(s)" in log or (
        f"{name}: {k} sample(s) skipped, 2 damage record(s)" in log), log
    assert f"{k} sample(s) skipped in total, in 1 of {len(d.paths)} shard(s)" in log


@pytest.mark.timeout(60)
def test_a_server_refuses_to_start_on_a_zero_byte_tar(servers, tmp_path) -> None:
    d = zero_byte_tar(str(tmp_path / "d"))
    with pytest.raises(ServerUnavailable, match=r"train-000001a\.tar \(byte offset 0\): empty "
                       r"file \(zero bytes\)"):
        servers(d.paths, extra_args=["--cache-dir", str(tmp_path / "c")])
