"""CurveZMQ: allowed clients get exact epochs over encrypted links; others are refused fast."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest

from dataflow.client import DataLoader
from dataflow.errors import ServerUnavailable
from dataflow.security import generate_keys

BATCH = 16
REFUSED_WITHIN_S = 10.0
# Every demo sample's text is f"sample {id} " repeated: in the clear on an unencrypted link.
MARKER = b"sample 1"


@dataclass(frozen=True)
class Keys:
    server_secret: Path
    server_public: Path
    client_secret: Path
    stranger_secret: Path
    allowed: Path

    def server_args(self) -> list[str]:
        return ["--curve-secret-key", str(self.server_secret),
                "--curve-allowed-keys", str(self.allowed)]


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    server_public, server_secret = generate_keys(str(tmp_path / "server"), "server")
    _, client_secret = generate_keys(str(tmp_path / "allowed"), "trainer")
    _, stranger_secret = generate_keys(str(tmp_path / "other"), "stranger")
    # The client secret must not sit among the allowed public keys: move it out.
    moved = tmp_path / "trainer.key_secret"
    client_secret.rename(moved)
    return Keys(server_secret, server_public, moved, stranger_secret, tmp_path / "allowed")


def _one_epoch(endpoint: str, stats: dict[str, int] | None = None, **kwargs) -> list[int]:
    """The ids of one epoch; the loader's ``stats()`` after it into ``stats``."""
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, timeout=20,
                    **kwargs) as dl:
        ids = [i for batch in dl for i in batch["id"].tolist()]
        if stats is not None:
            stats.update(dl.stats())
        return ids


@pytest.mark.timeout(60)
def test_allowed_client_gets_an_exact_epoch(keys: Keys, demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], workers=2, extra_args=keys.server_args())
    ids = _one_epoch(server.endpoint, curve_key=keys.client_secret,
                     server_key=keys.server_public)
    assert Counter(ids) == Counter(range(demo.total))


@pytest.mark.timeout(60)
def test_a_curve_session_on_this_host_uses_shared_memory(keys: Keys, demo_data,
                                                         servers) -> None:
    """The HELLO offering the segment, the INDEX proving it and every BATCH descriptor travel
    over the authenticated sockets; the arrays land in the segment."""
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=keys.server_args())
    with DataLoader(server.endpoint, batch_size=BATCH, rank=0, world_size=1, timeout=20,
                    curve_key=keys.client_secret, server_key=keys.server_public,
                    read_ahead=False) as dl:  # every batch received is delivered
        ids = [i for batch in dl for i in batch["id"].tolist()]
        stats = dl.stats()
    assert Counter(ids) == Counter(range(demo.total))
    assert stats["shm_sessions"] == 1 and stats["shm_batches"] == stats["delivered"] > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("who", ["stranger", "no keys"])
def test_refused_client_fails_fast(who: str, keys: Keys, demo_data, servers) -> None:
    demo = demo_data("arrow")
    server = servers([str(p) for p in demo.paths], extra_args=keys.server_args())
    cred = ({"curve_key": keys.stranger_secret, "server_key": keys.server_public}
            if who == "stranger" else {})
    t0 = time.monotonic()
    with pytest.raises(ServerUnavailable, match="authentication refused") as err:
        DataLoader(server.endpoint, batch_size=BATCH, rank=0, world_size=1, timeout=60, **cred)
    assert time.monotonic() - t0 < REFUSED_WITHIN_S
    assert server.endpoint in str(err.value)
    if who == "stranger":
        server.proc.send_signal(signal.SIGTERM)  # it logs its counters as it stops
        server.proc.wait(10)
        log = server.stderr_tail(20000)
        assert "authentication refused (CURVE)" in log
        assert "'auth_refused': 0" not in log and "'auth_refused': " in log


def _capture(server_args: list[str], tmp_path: Path, demo, servers, least: int = 50_000,
             stats: dict[str, int] | None = None, **cred) -> bytes:
    """Raw bytes of every packet on ``lo`` to and from the server's and readers' ports while
    one epoch runs (at least ``least`` bytes of them, else the capture failed)."""
    server = servers([str(p) for p in demo.paths], workers=2, extra_args=server_args)
    ports = [urlparse(e).port for e in [server.endpoint, *server.ready["data_endpoints"]]]
    pcap = tmp_path / "lo.pcap"
    filt = " or ".join(f"tcp port {p}" for p in ports)
    cmd = ["tcpdump", "-i", "lo", "--immediate-mode", "-U", "-s", "0", "-Z", "root",
           "-w", str(pcap), filt]
    dump = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    try:
        assert dump.stderr is not None
        os.set_blocking(dump.stderr.fileno(), True)
        line = dump.stderr.readline()  # "listening on lo, ..." once it captures
        assert b"listening" in line, line
        ids = _one_epoch(server.endpoint, stats, **cred)
        assert Counter(ids) == Counter(range(demo.total))
        time.sleep(1.5)  # packets reach the ring buffer, then the file
    finally:
        dump.send_signal(signal.SIGINT)
        _, tail = dump.communicate(timeout=10)
    data = pcap.read_bytes()
    assert len(data) > least, f"the capture holds too little to judge: {tail!r}"
    return data


@pytest.mark.timeout(90)
@pytest.mark.skipif(shutil.which("tcpdump") is None or os.geteuid() != 0,
                    reason="needs tcpdump and root to capture on lo")
def test_no_sample_bytes_in_clear(keys: Keys, demo_data, servers, tmp_path: Path) -> None:
    demo = demo_data("arrow")
    for name in ("clear", "curve", "shm"):
        (tmp_path / name).mkdir()
    clear = _capture([], tmp_path / "clear", demo, servers, shared_memory="off")
    assert MARKER in clear  # the check can see sample text when it travels in clear
    sealed = _capture(keys.server_args(), tmp_path / "curve", demo, servers,
                      curve_key=keys.client_secret, server_key=keys.server_public,
                      shared_memory="off")
    assert MARKER not in sealed
    assert b"sample " not in sealed
    # Same host, same user: the arrays land in shared memory, and only headers cross lo.
    stats: dict[str, int] = {}
    # no read-ahead: a reply to a request the loader gave up at its close (the next epoch's
    # first batches) is dropped uncounted, and may have come in TCP frames
    shared = _capture([], tmp_path / "shm", demo, servers, least=1000, stats=stats,
                      read_ahead=False)
    received = stats["delivered"] + stats["discarded"] + stats["waiting"]
    assert stats["shm_batches"] > 0, stats
    if stats["shm_batches"] >= received:
        assert MARKER not in shared, stats
    else:  # a request that found no free slot came in TCP frames, as designed: fewer markers
        assert shared.count(MARKER) < clear.count(MARKER), stats
    print(f"capture: {len(clear)} bytes in clear with {clear.count(MARKER)} markers; "
          f"{len(sealed)} bytes with CURVE, none")
