"""Which reader the frontend hands the next request to (:func:`server.pool.least_loaded`)."""

from __future__ import annotations

from collections import Counter

from dataflow.server.pool import Worker, least_loaded


def _worker(name: str, tasks: int, ready: bool = True) -> Worker:
    w = Worker(name.encode(), process=None, slot=0, ready=ready)  # type: ignore[arg-type]
    w.tasks = {(b"s", i): None for i in range(tasks)}  # type: ignore[misc]
    return w


def _pick(workers: list[Worker], backlog: dict[str, int], capacity: int = 2) -> str | None:
    chosen = least_loaded(workers, capacity, lambda ident: backlog.get(ident.decode(), 0))
    return None if chosen is None else chosen.identity.decode()


def test_fewest_tasks_then_least_backlog_then_the_first() -> None:
    a, b, c = _worker("a", 0), _worker("b", 0), _worker("c", 1)
    assert _pick([a, b, c], {}) == "a"
    assert _pick([a, b, c], {"a": 19_000_000}) == "b"  # a's I/O thread still writes a reply
    assert _pick([a, b, c], {"a": 5, "b": 5}) == "a"
    assert _pick([c, a], {"a": 10**9}) == "a"  # tasks first: the backlog only breaks ties


def test_only_ready_readers_with_room() -> None:
    full, starting = _worker("full", 2), _worker("starting", 0, ready=False)
    assert _pick([full, starting], {}) is None
    assert _pick([full, starting, _worker("ok", 1)], {"ok": 10**9}) == "ok"


def test_one_client_at_a_time_alternates_readers_while_replies_are_written() -> None:
    """A request every time the last reply was handed to ZeroMQ (the task done at once), its
    bytes written only after the next request was dispatched: by tasks alone reader 0 would
    take all of them."""
    workers = [_worker(f"r{i}", 0) for i in range(3)]
    backlog: dict[str, int] = {}
    writing: list[str] = []
    chosen = []
    for _ in range(12):
        pick = _pick(workers, backlog)
        assert pick is not None
        chosen.append(pick)
        backlog[pick] = backlog.get(pick, 0) + (4 << 20)  # SENT
        writing.append(pick)
        if len(writing) > 2:  # the oldest reply written: DONE
            done = writing.pop(0)
            backlog[done] -= (4 << 20)
    assert Counter(chosen) == {"r0": 4, "r1": 4, "r2": 4}, chosen
