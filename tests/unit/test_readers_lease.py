"""Read leases on local shards (:mod:`dataflow.readers.lease`): a guard holding one reports
its file unchanged with no system call while writers wait in the kernel, lets them in at its
next settle or close, and from then on reads the file only once it holds the lease again and
finds the file unchanged. Writers and other holders are real child processes (a process
breaks its own leases too, and would wait on itself)."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ShardChangedError
from dataflow.readers import guard as guards
from dataflow.readers import lease, open_shard
from dataflow.readers.guard import FileGuard, all_unchanged, every_guard_leased, settle
from dataflow.readers.tar import sharedindex
from dataflow.readers.tar.reader import TarReader

WRITE = "import sys; f = open(sys.argv[1], 'r+b'); f.write(b'Z' * 16); f.close()"
OPEN_UNTIL_TOLD = ("import sys; f = open(sys.argv[1], 'r+b'); print('open', flush=True); "
                   "sys.stdin.readline(); f.close()")
TRUNCATE = "import sys; f = open(sys.argv[1], 'wb'); f.write(b'Z' * 16); f.close()"
HOLD_UNTIL_TOLD = ("import fcntl, os, signal, sys\n"
                   "signal.signal(signal.SIGIO, signal.SIG_IGN)\n"
                   "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
                   "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)\n"
                   "print('held', flush=True)\n"
                   "sys.stdin.readline()\n"
                   "fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)\n")
"""Another reader's lease, let go only when told (a read in progress keeps its lease)."""
TRY_OPEN = ("import os, sys\ntry:\n    os.close(os.open(sys.argv[1], os.O_WRONLY | "
            "os.O_NONBLOCK))\nexcept BlockingIOError:\n    sys.exit(3)")


def _leasable_dir(tmp_path: Path) -> Path:
    for where in (tmp_path, Path("/dev/shm")):
        fd = os.open(where, os.O_RDONLY)
        try:
            if lease.filesystem(fd) in lease.LOCAL_FS:
                return where
        finally:
            os.close(fd)
    pytest.skip(f"neither {tmp_path} nor /dev/shm is on a filesystem leases are taken on")


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(lease, "_armed", False)
    monkeypatch.setattr(lease, "_wakeup", -1)
    previous = signal.getsignal(signal.SIGIO)
    why = lease.arm()
    if why is not None:
        pytest.skip(f"no leases on this host: {why}")
    with open(lease.BREAK_TIME) as f:
        if int(f.read()) < 10:
            pytest.skip(f"{lease.BREAK_TIME} < 10 s: a loaded host may stall longer than a "
                        "writer waits")
    try:
        yield
    finally:
        signal.signal(signal.SIGIO, previous)
        os.close(signal.set_wakeup_fd(-1))
        os.close(lease._wakeup)
        lease.take_pending()


@pytest.fixture
def shard(tmp_path: Path, armed: None) -> Iterator[str]:
    d = _leasable_dir(tmp_path) / f"lease-{os.getpid()}-{time.monotonic_ns()}"
    d.mkdir()
    path = d / "shard.bin"
    path.write_bytes(bytes(4096))
    try:
        yield str(path)
    finally:
        shutil.rmtree(d)


@contextlib.contextmanager
def _child(code: str, *args: str, talk: bool = False) -> Iterator[subprocess.Popen[str]]:
    """A Python child process running ``code`` with ``args``, killed if still running;
    ``talk``: with pipes to its stdin and stdout."""
    pipe = subprocess.PIPE if talk else None
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdin=pipe, stdout=pipe,
                            text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _wait(what, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.timeout(60)
def test_a_writer_waits_for_a_leased_guard_and_its_write_is_seen_after(shard: str) -> None:
    with closing(FileGuard(shard)) as guard:
        assert guard.leased
        with _child(WRITE, shard) as writer:
            _wait(lease.pending)  # the writer's open broke the lease
            guard.check()  # unchanged (checked with fstat now); the writer still waits
            time.sleep(0.2)
            assert writer.poll() is None, "the writer opened the file while the lease was held"
            assert guard.leased  # checks never let go: a read may be using the map
            settle()
            assert not guard.leased
            assert writer.wait(timeout=30) == 0
        assert not all_unchanged([guard])
        with pytest.raises(ShardChangedError, match="shard.bin"):
            guard.check()


@pytest.mark.timeout(60)
def test_every_guard_leased_until_one_is_not(shard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one comparison a gather asks first: false from a lease breaking (settled) until
    the guard holds it again, and while a guard without a lease is open."""
    monkeypatch.setattr(guards, "_OPEN", {})  # this test's guards only
    monkeypatch.setattr(guards, "_LEASED", {})
    with closing(FileGuard(shard)) as guard:
        assert every_guard_leased()
        with _child(WRITE, shard) as writer:
            _wait(lease.pending)
            settle()
            assert not guard.leased and not every_guard_leased()
            assert writer.wait(timeout=30) == 0
        assert not all_unchanged([guard])  # written: taken again, and found changed
        assert not every_guard_leased()
    assert every_guard_leased()
    with closing(FileGuard(shard)) as guard:
        assert guard.leased and every_guard_leased()
        monkeypatch.setattr(lease, "take", lambda fd, url: lease.Taken.NONE)
        with closing(FileGuard(shard)) as unleased:
            assert not unleased.leased and not every_guard_leased()
            assert all_unchanged([guard, unleased])  # checked with fstat
        assert every_guard_leased()


@pytest.mark.timeout(60)
def test_settle_turns_back_only_the_guards_whose_lease_broke(tmp_path: Path,
                                                             shard: str) -> None:
    other = Path(shard).with_name("other.bin")
    other.write_bytes(bytes(4096))
    guards = [FileGuard(shard), FileGuard(str(other))]
    try:
        assert all(g.leased for g in guards)
        with _child(WRITE, str(other)) as writer:
            _wait(lease.pending)
            settle()
            assert [g.leased for g in guards] == [True, False]
            assert writer.wait(timeout=30) == 0
        assert all_unchanged(guards[:1]) and not all_unchanged(guards)
    finally:
        for g in guards:
            g.close()


@pytest.mark.timeout(60)
def test_closing_a_guard_lets_writers_in_though_a_map_keeps_the_file_open(shard: str) -> None:
    guard = FileGuard(shard)
    view = mmap.mmap(guard.fd, 0, access=mmap.ACCESS_READ)  # holds the open file, and a lease
    try:
        assert guard.leased
        guard.close()
        tried = subprocess.run([sys.executable, "-c", TRY_OPEN, shard], timeout=30)
        assert tried.returncode == 0, "a writer still found the lease held after close"
    finally:
        view.close()
        lease.take_pending()


@pytest.mark.timeout(60)
def test_a_file_open_for_writing_is_refused_naming_it(shard: str) -> None:
    with open(shard, "r+b"):
        with pytest.raises(ShardChangedError, match="shard.bin: open for writing"):
            FileGuard(shard)
    with closing(FileGuard(shard)) as guard:
        assert guard.leased


@pytest.mark.timeout(60)
def test_a_broken_guard_reads_again_once_the_writer_closed_the_file_unchanged(
        shard: str) -> None:
    with closing(FileGuard(shard)) as guard:
        with _child(OPEN_UNTIL_TOLD, shard, talk=True) as writer:
            _wait(lease.pending)
            settle()
            assert guard.broken and not guard.leased
            assert writer.stdout.readline() == "open\n"
            assert not all_unchanged([guard])
            with pytest.raises(ShardChangedError, match="shard.bin: open for writing"):
                guard.check()
            writer.stdin.write("close\n")
            writer.stdin.flush()
            assert writer.wait(timeout=30) == 0
        assert all_unchanged([guard])  # nothing written: the lease taken again
        assert guard.leased and not guard.broken and lease.held(guard.fd)
        guard.check()


@pytest.mark.timeout(60)
def test_a_guard_that_let_go_is_refused_while_another_holder_keeps_the_writer_waiting(
        shard: str) -> None:
    """The window a check alone left: this reader let go first and finds the file unchanged
    (the writer still waits for the other holder, whose read is in progress); had it read the
    map, the writer, let in when the other lets go, would cut the file short under it."""
    with closing(FileGuard(shard)) as guard, \
            _child(HOLD_UNTIL_TOLD, shard, talk=True) as other:
        assert other.stdout.readline() == "held\n"
        with _child(TRUNCATE, shard) as writer:
            _wait(lease.pending)
            settle()
            assert os.fstat(guard.fd).st_size == 4096  # unchanged so far
            assert not all_unchanged([guard])
            with pytest.raises(ShardChangedError, match="shard.bin: open for writing"):
                guard.check()
            assert writer.poll() is None, "the writer got in while a lease was held"
            other.stdin.write("release\n")
            other.stdin.flush()
            assert writer.wait(timeout=30) == 0
        assert not all_unchanged([guard])
        with pytest.raises(ShardChangedError, match="changed since the dataset index"):
            guard.check()
        assert guard.broken and not lease.held(guard.fd)


@pytest.mark.timeout(60)
def test_no_lease_on_a_filesystem_not_listed_said_once(shard: str,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(lease, "LOCAL_FS", {})
    monkeypatch.setattr(lease, "_told", set())
    with caplog.at_level(logging.INFO, logger=lease.__name__):
        for _ in range(2):
            guard = FileGuard(shard)
            assert not guard.leased
            guard.close()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and shard in said[0] and "statfs type 0x" in said[0], said


@pytest.mark.timeout(60)
def test_no_lease_in_a_process_that_did_not_arm(shard: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "_armed", False)
    guard = FileGuard(shard)
    assert not guard.leased
    guard.close()


@pytest.mark.timeout(60)
def test_a_lease_breaking_wakes_a_loop_polling_the_wakeup_descriptor(shard: str) -> None:
    with closing(FileGuard(shard)):
        wake = lease.wakeup_fd()
        assert wake is not None and select.select([wake], [], [], 0)[0] == []
        with _child(WRITE, shard) as writer:
            assert select.select([wake], [], [], 30)[0] == [wake]  # not a timeout: the signal
            lease.drain()
            assert select.select([wake], [], [], 0)[0] == []
            settle()
            assert writer.wait(timeout=30) == 0


@pytest.mark.timeout(60)
def test_a_shared_tar_index_keeps_its_values_when_its_file_is_rewritten(
        shard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader maps a tar's saved member index under a lease (the host's readers share its
    pages); a writer rewriting the index file in place waits, the reader copies what it
    mapped into its own memory at the same addresses before letting go, and reads on with
    the index it verified; the index's guard is closed, so the shard's lease alone again
    spares the reader every per-guard check."""
    monkeypatch.setattr(guards, "_OPEN", {})  # this test's guards only
    monkeypatch.setattr(guards, "_LEASED", {})
    root = os.path.dirname(shard)
    path = str(make_demo(root, DemoSpec(fmt="tar", shards=1, samples_per_shard=20,
                                        image_shape=(3, 4, 4)), progress=None).paths[0])
    monkeypatch.setattr(sharedindex, "_budget", 1)
    open_shard(path, cache_dir=root).close()  # builds and saves the index beside the tar
    with open_shard(path, cache_dir=root) as reader:
        assert isinstance(reader, TarReader) and not reader.index_built
        assert reader._index_file is not None and reader._index_file.data is not None
        offsets = reader._index.offsets.copy()
        ids = reader.read(0, len(reader))["id"].tolist()
        assert _maps(path + ".dfidx")
        spoil = ("import sys; f = open(sys.argv[1], 'r+b'); f.seek(128); "
                 "f.write(b'\\xff' * 4096); f.close()")
        with _child(spoil, path + ".dfidx") as writer:
            _wait(lease.pending)
            settle()
            assert writer.wait(timeout=30) == 0
        assert every_guard_leased() and len(guards._OPEN) == 1  # the shard's
        assert not _maps(path + ".dfidx")  # the copy is the reader's own memory
        assert (reader._index.offsets == offsets).all()
        assert reader.read(0, len(reader))["id"].tolist() == ids
    assert sharedindex._mapped == 0


@pytest.mark.timeout(60)
def test_no_more_shared_tar_indexes_than_the_descriptors_allow(
        shard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = os.path.dirname(shard)
    paths = [str(p) for p in make_demo(root, DemoSpec(fmt="tar", shards=3, samples_per_shard=5,
                                                      image_shape=(1, 2, 2)),
                                       progress=None).paths]
    for p in paths:
        open_shard(p, cache_dir=root).close()
    monkeypatch.setattr(sharedindex, "_budget", 2)
    readers = [open_shard(p, cache_dir=root) for p in paths]
    try:
        assert [r._index_file is not None for r in readers] == [True, True, False]
        assert all(len(r.read(0, len(r))["id"]) == len(r) for r in readers)
    finally:
        for r in readers:
            r.close()
    assert sharedindex._mapped == 0


def _maps(path: str) -> bool:
    """Whether this process maps ``path``."""
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + path) for line in f)


@pytest.mark.timeout(60)
def test_a_mapped_tar_index_that_fails_its_digest_is_let_go_and_rebuilt(
        shard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    root = os.path.dirname(shard)
    path = str(make_demo(root, DemoSpec(fmt="tar", shards=1, samples_per_shard=20,
                                        image_shape=(3, 4, 4)), progress=None).paths[0])
    monkeypatch.setattr(sharedindex, "_budget", 1)
    with open_shard(path, cache_dir=root) as reader:
        ids = reader.read(0, len(reader))["id"].tolist()
    with open(path + ".dfidx", "r+b") as f:  # a bit of an offset flipped: the digest fails
        f.seek(-9, os.SEEK_END)
        byte = f.read(1)
        f.seek(-9, os.SEEK_END)
        f.write(bytes([byte[0] ^ 1]))
    with open_shard(path, cache_dir=root) as reader:
        assert isinstance(reader, TarReader) and reader.index_built
        assert reader._index_file is None and sharedindex._mapped == 0
        assert reader.read(0, len(reader))["id"].tolist() == ids
