"""Discovery: the servers' setting, lookups with an injected resolver, the membership rules
and the scheduler's joins and leaves (fake clock, no sockets)."""

from __future__ import annotations

import random
import socket
import threading

import pytest

from dataflow.client import DataLoader
from dataflow.client.cursor import Pass
from dataflow.client.discovery import (
    ServerSource,
    Watcher,
    first_lookup,
    lookup,
    parse_servers,
    servers_setting,
)
from dataflow.client.membership import Changes, Membership
from dataflow.client.passes import PassPlan
from dataflow.client.scheduler import CONTROL, Scheduler, State
from dataflow.client.stream import Demand
from dataflow.errors import ConfigError, InternalError, ServerUnavailable
from dataflow.plan import Batches, Range

# -- the setting --------------------------------------------------------------------------------


@pytest.mark.parametrize("given, endpoints", [
    ("tcp://a:1", ("tcp://a:1",)),
    ("tcp://a:1, tcp://b:2", ("tcp://a:1", "tcp://b:2")),
    (["tcp://a:1", "tcp://b:2"], ("tcp://a:1", "tcp://b:2")),
    (("tcp://a:1",), ("tcp://a:1",)),
])
def test_static_forms(given, endpoints) -> None:
    source = parse_servers(given)
    assert source.endpoints == endpoints and not source.dynamic


def test_dynamic_forms() -> None:
    dns = parse_servers("dns+tcp://loader.ns.svc.cluster.local:5555")
    assert (dns.host, dns.port, dns.dynamic) == ("loader.ns.svc.cluster.local", 5555, True)
    assert parse_servers(["dns+tcp://x:1"]).host == "x"
    reg = parse_servers("file:///shared/servers.txt")
    assert (reg.path, reg.dynamic) == ("/shared/servers.txt", True)


@pytest.mark.parametrize("given, words", [
    ("dns+tcp://loader", "dns+tcp://name:port"),
    ("dns+tcp://loader:http", "dns+tcp://name:port"),
    ("dns+tcp://loader:0", "port in 1..65535"),
    ("dns+tcp://loader:70000", "port in 1..65535"),
    ("file://relative.txt", "absolute"),
    ("tcp://a:1,,tcp://b:1", "tcp://host:port"),
    ("a:1", "tcp://host:port"),
    ("tcp://a:1,tcp://a:1", "must not repeat"),
    (["tcp://a:1", "dns+tcp://x:1"], "only entry"),
    ("tcp://a:1,file:///x", "only entry"),
    (5555, "int"),
])
def test_bad_settings_name_the_field(given, words) -> None:
    with pytest.raises(ConfigError, match="`servers`") as info:
        parse_servers(given)
    assert words in str(info.value)


def test_argument_else_env_var() -> None:
    assert servers_setting("tcp://a:1", "tcp://b:1").endpoints == ("tcp://a:1",)
    assert servers_setting(None, "tcp://b:1,tcp://c:1").endpoints == ("tcp://b:1", "tcp://c:1")
    with pytest.raises(ConfigError, match="^DATAFLOW_SERVERS='loader:5555': `servers` must be"):
        servers_setting(None, "loader:5555")


def test_loader_reads_the_env_var(monkeypatch) -> None:
    monkeypatch.delenv("DATAFLOW_SERVERS", raising=False)
    with pytest.raises(ConfigError, match="`servers` not given and DATAFLOW_SERVERS is not set"):
        DataLoader(batch_size=8)
    monkeypatch.setenv("DATAFLOW_SERVERS", "dns+tcp://x")
    with pytest.raises(ConfigError, match="^DATAFLOW_SERVERS='dns"):
        DataLoader(batch_size=8)


def test_source_needs_exactly_one_form() -> None:
    with pytest.raises(ConfigError, match="one way"):
        ServerSource("x", endpoints=("tcp://a:1",), host="b", port=1)


# -- lookups ------------------------------------------------------------------------------------


def _resolver(table: dict[str, list[str]]):
    """A getaddrinfo over ``table`` (name -> addresses), as the real one answers."""
    def getaddrinfo(host, port, type=0):
        assert type == socket.SOCK_STREAM
        if not table.get(host):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, type, 6, "",
                 (a, port) if ":" not in a else (a, port, 0, 0)) for a in table[host]]
    return getaddrinfo


def test_dns_lookup_gives_every_address_sorted_once() -> None:
    table = {"loader": ["10.0.0.2", "10.0.0.1", "10.0.0.2", "fd00::5"]}
    source = parse_servers("dns+tcp://loader:5555")
    assert lookup(source, _resolver(table)) == (
        "tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555", "tcp://[fd00::5]:5555")


def test_dns_lookup_failure_names_the_setting() -> None:
    with pytest.raises(ServerUnavailable, match=r"dns\+tcp://gone:1: does not resolve"):
        lookup(parse_servers("dns+tcp://gone:1"), _resolver({}))


def test_file_registry(tmp_path) -> None:
    reg = tmp_path / "servers.txt"
    reg.write_text("# loaders\ntcp://b:2\n\ntcp://a:1  # rack 3\ntcp://b:2\n")
    source = parse_servers(f"file://{reg}")
    assert lookup(source) == ("tcp://a:1", "tcp://b:2")
    reg.write_text("tcp://a:1\nb:2\n")
    with pytest.raises(ServerUnavailable, match="line 2 is not an endpoint"):
        lookup(source)
    with pytest.raises(ServerUnavailable, match="cannot be read"):
        lookup(parse_servers(f"file://{tmp_path}/missing.txt"))


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_first_lookup_retries_until_a_server_is_found() -> None:
    clock, table = _Clock(), {}
    source = parse_servers("dns+tcp://loader:5555")

    def find():
        if len(clock.slept) == 3:
            table["loader"] = ["10.0.0.1"]
        return lookup(source, _resolver(table))

    assert first_lookup(source, find, 10, clock=clock, sleep=clock.sleep) == (
        "tcp://10.0.0.1:5555",)
    assert clock.slept == [1.0, 1.0, 1.0]


def test_first_lookup_of_a_name_with_no_address_fails_after_the_timeout() -> None:
    clock = _Clock()
    source = parse_servers("dns+tcp://loader.ns.svc:5555")
    with pytest.raises(ServerUnavailable) as info:
        first_lookup(source, lambda: lookup(source, _resolver({})), 2.5, clock=clock,
                     sleep=clock.sleep)
    assert str(info.value).startswith("dns+tcp://loader.ns.svc:5555: no server found within "
                                      "2.5 s (last lookup: ")
    assert "does not resolve" in str(info.value)
    assert clock.slept == [1.0, 1.0, 0.5]


def test_first_lookup_of_an_empty_registry_fails(tmp_path) -> None:
    clock = _Clock()
    (tmp_path / "s.txt").write_text("# nobody yet\n")
    source = parse_servers(f"file://{tmp_path}/s.txt")
    with pytest.raises(ServerUnavailable, match="names no server"):
        first_lookup(source, lambda: lookup(source), 1, clock=clock, sleep=clock.sleep)


def test_watcher_runs_lookups_on_its_thread_and_reports_failures() -> None:
    answers = [("tcp://a:1",), RuntimeError("boom")]
    woken = threading.Semaphore(0)

    def find():
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    watcher = Watcher(find, woken.release)
    watcher.start()
    try:
        assert watcher.result() is None
        watcher.ask()
        assert woken.acquire(timeout=30)
        assert watcher.result() == (("tcp://a:1",), "")
        assert watcher.result() is None
        watcher.ask()
        assert woken.acquire(timeout=30)
        assert watcher.result() == (None, "lookup failed: RuntimeError: boom")
    finally:
        watcher.close()
    assert not watcher._thread.is_alive()


# -- membership ---------------------------------------------------------------------------------

A, B, C = "tcp://a:1", "tcp://b:1", "tcp://c:1"


def _never_lost(endpoint: str) -> bool:
    return False


def test_lookups_are_due_every_interval_one_at_a_time() -> None:
    m = Membership([A], interval=10, now=0)
    assert m.deadline(0) == 10 and not m.lookup_due(9.9)
    assert m.lookup_due(10) and not m.lookup_due(11)
    assert m.deadline(11) == float("inf")
    assert m.found(12, [A], _never_lost) == Changes()
    assert m.deadline(12) == 10 and not m.lookup_due(21.9) and m.lookup_due(22)


def test_new_servers_join_at_once() -> None:
    m = Membership([A], interval=1, now=0)
    assert m.found(1, [C, A, B], _never_lost) == Changes(joins=(B, C))
    assert m.members == (A, B, C)


def test_a_server_leaves_after_three_missed_lookups_and_flapping_resets_the_count() -> None:
    m = Membership([A, B], interval=1, now=0)
    assert m.found(1, [A], _never_lost) == Changes()
    assert m.found(2, [A], _never_lost) == Changes()
    assert m.found(3, [A, B], _never_lost) == Changes()  # back: count reset
    assert m.found(4, [A], _never_lost) == Changes()
    assert m.found(5, [A], _never_lost) == Changes()
    assert m.found(6, [A], _never_lost) == Changes(leaves=(B,))
    assert m.members == (A,)
    assert m.found(7, [A, B], _never_lost) == Changes(joins=(B,))  # found again: a new join


def test_a_lost_server_leaves_at_its_first_missed_lookup() -> None:
    m = Membership([A, B], interval=1, now=0)
    assert m.found(1, [A, B], lambda e: e == B) == Changes()  # lost but still named: stays
    assert m.found(2, [A], lambda e: e == B) == Changes(leaves=(B,))


def test_a_failed_lookup_changes_nothing() -> None:
    m = Membership([A, B], interval=1, now=0)
    for t in range(1, 10):
        assert m.found(t, None, lambda e: True) == Changes()
    assert m.members == (A, B)


def test_membership_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="`resolve_interval`"):
        Membership([A], interval=0, now=0)
    with pytest.raises(ConfigError, match="`absent_limit`"):
        Membership([A], interval=1, now=0, absent_limit=0)


# -- the scheduler's joins and leaves -----------------------------------------------------------


def _batches(n: int) -> Batches:
    return Batches.of([[Range(0, 4 * i, 4 * i + 4)] for i in range(n)])


def _sched(*credits: int) -> Scheduler:
    s = Scheduler([f"tcp://s{i}:1" for i in range(len(credits))], timeout=10, heartbeat_s=1,
                  silent_s=3, grace=5)
    for i, c in enumerate(credits):
        s.link(i, CONTROL, up=True, now=0.0)
        assert s.grant(i, c, now=0.0, readers=c)
    return s


def test_a_server_joining_mid_epoch_takes_unrequested_batches_within_the_depth() -> None:
    s = _sched(2)
    assert s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(10)),)))
    assert [a.index for a in s.assignments(taken=0, now=0)] == [0, 1]
    new = s.add("tcp://new:1", now=1)
    assert s.hellos_due(1) == [] and s.state(new) is State.DOWN  # not connected yet
    s.link(new, CONTROL, up=True, now=1)
    assert s.hellos_due(1) == [new] and s.state(new) is State.JOINING
    assert s.grant(new, 3, now=2, readers=3)  # its first join
    assert s.depth == 5  # its credits count at once
    assert [(a.server, a.index) for a in s.assignments(taken=1, now=2)] == [
        (new, 2), (new, 3), (new, 4)]  # server 0 holds its 2 credits' worth
    assert s.follow(Demand(2, (PassPlan(Pass(0, 0), _batches(10)),)))
    assert s.depth == 5  # the next epoch counts the new server's credits


def test_a_retired_server_gives_its_open_batches_to_the_others() -> None:
    s = _sched(2, 2)
    assert s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(6)),)))
    got = s.assignments(taken=0, now=0)
    assert [(a.server, a.index) for a in got] == [(0, 0), (1, 1), (0, 2), (1, 3)]
    s.retire(1, now=1)
    assert s.state(1) is State.GONE and s.find("tcp://s1:1") is None
    assert s.on_reply(1, got[1].req_id, now=1) is None  # a late reply is discarded
    for a in got[::2]:
        s.on_reply(0, a.req_id, now=1)
    again = s.assignments(taken=4, now=1)
    assert [(a.server, a.index, a.retry) for a in again] == [(0, 1, True), (0, 3, True)]
    assert s.hellos_due(100) == [] and s.check(100) == []
    with pytest.raises(InternalError, match="removed"):
        s.lost(1, now=2)
    assert s.add("tcp://s1:1", now=3) == 2  # found again: a new server, a new number
    with pytest.raises(InternalError, match="added twice"):
        s.add("tcp://s1:1", now=3)


def test_every_server_gone_names_no_endpoint_but_says_so() -> None:
    s = _sched(1)
    assert s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(3)),)))
    s.assignments(taken=0, now=0)
    s.retire(0, now=0)
    s.check(1)
    with pytest.raises(ServerUnavailable, match="every server left"):
        s.check(12)


@pytest.mark.parametrize("seed", range(20))
def test_joins_and_leaves_at_random_keep_every_batch_exactly_once(seed: int) -> None:
    """Servers join, leave and answer in a random order; every batch is accepted once."""
    rng = random.Random(seed)
    s = _sched(2, 1)
    n = 40
    assert s.follow(Demand(1, (PassPlan(Pass(0, 0), _batches(n)),)))
    accepted: list[int] = []
    pending: list[tuple[int, int]] = []  # (server, req_id) sent and not answered
    now, taken, names = 0.0, 0, 2
    while len(accepted) < n:
        now += 0.1
        members = [i for i in range(names) if s.state(i) is not State.GONE]
        roll = rng.random()
        if roll < 0.05 and len(members) > 1:
            s.retire(rng.choice(members), now)
        elif roll < 0.1:
            new = s.add(f"tcp://n{names}:1", now)
            names += 1
            s.link(new, CONTROL, up=True, now=now)
            assert s.hellos_due(now) == [new]
            credits = rng.randint(1, 3)
            s.grant(new, credits, now, readers=credits)
        for i in s.hellos_due(now):
            s.grant(i, 2, now, readers=2)
        pending += [(a.server, a.req_id) for a in s.assignments(taken, now)]
        rng.shuffle(pending)
        for server, req_id in pending[:rng.randint(0, len(pending))]:
            pending.remove((server, req_id))
            slot = s.on_reply(server, req_id, now)
            if slot is not None:
                accepted.extend(slot.indexes)
        done = set(accepted)
        while taken in done:  # the consumer takes batches in plan order
            taken += 1
        assert now < 1000, (accepted, pending)
    assert sorted(accepted) == list(range(n))


def test_watcher_closed_during_a_lookup_never_wakes_afterwards() -> None:
    started, release, woken = threading.Event(), threading.Event(), []

    def find():
        started.set()
        release.wait(30)
        return ("tcp://a:1",)

    watcher = Watcher(find, lambda: woken.append(1))
    watcher.start()
    watcher.ask()
    assert started.wait(30)
    watcher.close()  # the lookup is still under way
    release.set()
    watcher._thread.join(30)
    assert not watcher._thread.is_alive() and woken == [] and watcher.result() is None
