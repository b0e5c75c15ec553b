"""The server's credit ledger, sessions and parked replies: pure bookkeeping, no sockets."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow import wire
from dataflow.errors import InternalError
from dataflow.server.framing import SendResult
from dataflow.server.ledger import CREDIT_SLACK, Admitted, Ledger, Refusal, RefusalReason
from dataflow.server.sessions import ParkedReply, Sessions
from dataflow.wire.internal import Task

RANGES = np.array([[0, 0, 1]], dtype=np.int64)


def _drain(ledger: Ledger) -> list[tuple[bytes, int]]:
    out = []
    while (d := ledger.next_request()) is not None:
        out.append((d.token, d.req_id))
    return out


def test_dispatch_is_round_robin_over_sessions_with_queued_requests() -> None:
    ledger = Ledger()
    for key, n in ((b"a", 3), (b"b", 1), (b"c", 2)):
        ledger.open(key, 8)
        ledger.attach(key)
        for req_id in range(n):
            assert isinstance(ledger.admit(Task(key, req_id, RANGES)), Admitted)
    assert _drain(ledger) == [(b"a", 0), (b"b", 0), (b"c", 0), (b"a", 1), (b"c", 1), (b"a", 2)]
    assert ledger.queued() == 0 and ledger.outstanding(b"a") == 3


def test_a_session_that_queues_again_waits_for_its_next_turn() -> None:
    ledger = Ledger()
    for key in (b"a", b"b"):
        ledger.open(key, 8)
        ledger.attach(key)
    ledger.admit(Task(b"a", 0, RANGES))
    ledger.admit(Task(b"b", 0, RANGES))
    first = ledger.next_request()
    assert first is not None and first.token == b"a"
    ledger.admit(Task(b"a", 1, RANGES))
    assert _drain(ledger) == [(b"b", 0), (b"a", 1)]


@pytest.mark.parametrize("credits", [1, 2, 5])
def test_refused_at_exactly_twice_the_credits(credits: int) -> None:
    ledger = Ledger()
    ledger.open(b"s", credits)
    ledger.attach(b"s")
    limit = CREDIT_SLACK * credits
    for req_id in range(limit):
        assert ledger.admit(Task(b"s", req_id, RANGES)) == Admitted(req_id + 1)
    assert ledger.at_credits(b"s")
    refusal = ledger.admit(Task(b"s", limit, RANGES))
    assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.OVER_CREDITS
    assert "credit" in refusal.message and ledger.outstanding(b"s") == limit
    assert ledger.settle(b"s", 0)
    assert isinstance(ledger.admit(Task(b"s", limit, RANGES)), Admitted)


def test_at_credits_tells_when_notices_may_be_waiting() -> None:
    ledger = Ledger()
    ledger.open(b"s", 2)
    ledger.attach(b"s")
    ledger.admit(Task(b"s", 0, RANGES))
    assert not ledger.at_credits(b"s")
    ledger.admit(Task(b"s", 1, RANGES))
    assert ledger.at_credits(b"s")


def test_a_duplicate_outstanding_id_is_refused_and_reusable_once_settled() -> None:
    ledger = Ledger()
    ledger.open(b"s", 4)
    ledger.attach(b"s")
    ledger.admit(Task(b"s", 7, RANGES))
    refusal = ledger.admit(Task(b"s", 7, RANGES))
    assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.DUPLICATE_ID
    assert "7" in refusal.message and ledger.queued() == 1
    assert ledger.settle(b"s", 7)
    assert not ledger.settle(b"s", 7)
    assert isinstance(ledger.admit(Task(b"s", 7, RANGES)), Admitted)


def test_settle_after_bye_and_new_hello_is_not_charged_to_the_new_session() -> None:
    sessions, ledger = Sessions(), Ledger()
    old = sessions.open(b"conn", "rank 0", 2, now=0.0)
    ledger.open(old.token, 2)
    ledger.attach(old.token)
    ledger.admit(Task(old.token, 0, RANGES))
    ledger.admit(Task(old.token, 1, RANGES))
    assert ledger.next_request() is not None
    sessions.close(old)
    assert ledger.close(old.token) == 1
    new = sessions.open(b"conn", "rank 0", 2, now=1.0)
    assert new.token != old.token and sessions.by_token(old.token) is None
    ledger.open(new.token, 2)
    ledger.attach(new.token)
    ledger.admit(Task(new.token, 0, RANGES))
    assert not ledger.settle(old.token, 0)
    assert ledger.outstanding(new.token) == 1
    assert _drain(ledger) == [(new.token, 0)]


def test_a_reopened_key_does_not_inherit_its_old_turn_or_requests() -> None:
    ledger = Ledger()
    ledger.open(b"k", 4)
    ledger.attach(b"k")
    ledger.admit(Task(b"k", 0, RANGES))
    ledger.close(b"k")
    ledger.open(b"k", 4)
    ledger.attach(b"k")
    assert not ledger.settle(b"k", 0) and ledger.next_request() is None
    ledger.admit(Task(b"k", 1, RANGES))
    assert _drain(ledger) == [(b"k", 1)]


def test_a_closed_session_is_an_internal_error_to_admit_to() -> None:
    ledger = Ledger()
    with pytest.raises(InternalError, match="no credit account"):
        ledger.admit(Task(b"nobody", 0, RANGES))


def test_hello_on_an_open_connection_keeps_the_session() -> None:
    sessions = Sessions()
    first = sessions.open(b"conn", "a", 2, now=0.0)
    again = sessions.open(b"conn", "b", 4, now=5.0)
    assert again is first and again.credits == 4 and again.name == "b"
    assert again.last_seen == 5.0 and len(sessions) == 1


class Queue:
    """A client's send queue of ``room`` messages (None: the client is gone)."""

    def __init__(self, room: int | None) -> None:
        self.room = room
        self.sent: list[tuple] = []

    def send(self, frames: tuple) -> SendResult:
        if self.room is None:
            return SendResult.GONE
        if len(self.sent) >= self.room:
            return SendResult.FULL
        self.sent.append(frames)
        return SendResult.OK


def test_parked_replies_go_in_order_and_a_new_one_never_overtakes_them() -> None:
    s = Sessions().open(b"conn", "a", 2, now=0.0)
    replies = [ParkedReply(i, (b"h", b"x" * i), 1 + i, settles=i % 2 == 0) for i in range(4)]
    queue = Queue(room=0)
    for r in replies[:3]:
        assert s.parked.send(queue.send, r) == ([], False)
    assert len(s.parked) == 3 and s.parked.nbytes == 1 + 2 + 3
    queue.room = 2
    assert s.parked.send(queue.send) == (replies[:2], False)
    assert len(s.parked) == 1 and s.parked.nbytes == 3
    queue.room = 10
    assert s.parked.send(queue.send, replies[3]) == (replies[2:], False)
    assert queue.sent == [r.frames for r in replies] and s.parked.nbytes == 0
    assert not s.parked


def test_a_gone_client_keeps_its_parked_replies_for_the_caller_to_drop() -> None:
    s = Sessions().open(b"conn", "a", 2, now=0.0)
    reply = ParkedReply(0, (b"h",), 10, settles=True)
    assert s.parked.send(Queue(room=None).send, reply) == ([], True)
    assert s.parked.clear() == 1 and s.parked.nbytes == 0 and not s.parked


def test_sessions_count_parked_replies_of_open_sessions() -> None:
    sessions = Sessions()
    a = sessions.open(b"a", "a", 1, now=0.0)
    b = sessions.open(b"b", "b", 1, now=0.0)
    full = Queue(room=0)
    a.parked.send(full.send, ParkedReply(0, (b"h",), 10, settles=True))
    b.parked.send(full.send, ParkedReply(0, (b"h",), 5, settles=False))
    assert sessions.parked() == 2 and sessions.parked_bytes() == 15
    sessions.close(b)
    assert sessions.parked() == 1 and sessions.parked_bytes() == 10
    assert list(sessions) == [a]


def test_bye_and_hello_on_one_connection_never_buys_more_requests_at_the_readers() -> None:
    ledger = Ledger()
    for round_ in range(5):
        key = b"session-%d" % round_
        ledger.open(key, 1, owner=b"conn")
        ledger.attach(key)
        admitted = [isinstance(ledger.admit(Task(key, i, RANGES)), Admitted) for i in range(2)]
        while ledger.next_request() is not None:  # handed to readers, which never answer
            pass
        assert admitted == [round_ == 0] * 2
        ledger.close(key)
    assert ledger.draining() == 1
    ledger.open(b"other", 1, owner=b"other-conn")
    ledger.attach(b"other")
    assert isinstance(ledger.admit(Task(b"other", 0, RANGES)), Admitted)


def test_a_draining_account_frees_its_owner_once_its_requests_settle() -> None:
    ledger = Ledger()
    ledger.open(b"old", 1, owner=b"conn")
    ledger.attach(b"old")
    ledger.admit(Task(b"old", 0, RANGES))
    ledger.admit(Task(b"old", 1, RANGES))
    ledger.next_request()
    assert ledger.close(b"old") == 1  # the queued one is dropped, the dispatched one drains
    ledger.open(b"new", 1, owner=b"conn")
    ledger.attach(b"new")
    assert ledger.charged(b"new") == 1
    assert not ledger.settle(b"old", 0)
    assert ledger.draining() == 0 and ledger.charged(b"new") == 0
    assert isinstance(ledger.admit(Task(b"new", 0, RANGES)), Admitted)
    assert isinstance(ledger.admit(Task(b"new", 1, RANGES)), Admitted)


def test_a_requeued_task_goes_first_and_counts_its_attempts() -> None:
    ledger = Ledger()
    ledger.open(b"s", 4)
    ledger.attach(b"s")
    for req_id in range(3):
        ledger.admit(Task(b"s", req_id, RANGES))
    first = ledger.next_request()
    assert first is not None and first.attempts == 0
    assert ledger.requeue(first)
    again = ledger.next_request()
    assert again is not None and (again.req_id, again.attempts) == (0, 1)
    assert ledger.outstanding(b"s") == 3
    ledger.close(b"s")
    assert not ledger.requeue(again) and ledger.draining() == 0


def test_a_request_keeps_the_columns_its_session_had_when_it_was_admitted() -> None:
    sessions, ledger = Sessions(), Ledger()
    s = sessions.open(b"conn", "rank 0", 4, now=0.0, columns=("id", "image"))
    ledger.open(s.token, 4, owner=b"conn")
    ledger.attach(s.token)
    ledger.admit(Task(s.token, 0, RANGES, wire.BatchTag(1, 2, 3), s.columns))
    again = sessions.open(b"conn", "rank 0", 4, now=1.0)  # a second HELLO, without columns
    assert again is s and s.columns is None
    ledger.admit(Task(s.token, 1, RANGES, columns=s.columns))
    first = ledger.next_request()
    assert first is not None and (first.req_id, first.columns) == (0, ("id", "image"))
    assert ledger.requeue(first)
    retried = ledger.next_request()
    assert retried is not None and retried.columns == ("id", "image")
    assert (retried.attempts, retried.tag) == (1, (1, 2, 3))
    second = ledger.next_request()
    assert second is not None and (second.req_id, second.columns) == (1, None)


def test_requests_of_an_unattached_session_wait_unread_while_others_are_dispatched() -> None:
    ledger = Ledger()
    ledger.open(b"late", 4)
    ledger.open(b"ready", 4)
    ledger.attach(b"ready")
    ledger.admit(Task(b"late", 0, RANGES))
    ledger.admit(Task(b"ready", 0, RANGES))
    assert _drain(ledger) == [(b"ready", 0)]
    assert ledger.queued() == 1 and ledger.outstanding(b"late") == 1
    assert ledger.attach(b"late") and ledger.attach(b"late")  # idempotent
    assert _drain(ledger) == [(b"late", 0)]
    assert not ledger.attach(b"never-opened")


def test_a_blocked_address_waits_its_turn_without_holding_up_the_others() -> None:
    ledger = Ledger()
    for key, address in ((b"a1", "10.0.0.1"), (b"a2", "10.0.0.1"), (b"b", "10.0.0.2")):
        ledger.open(key, 4, address=address)
        ledger.attach(key)
        ledger.admit(Task(key, 0, RANGES))
    blocked = {"10.0.0.1"}
    assert _drain_while(ledger, blocked) == [(b"b", 0)]
    blocked.clear()
    assert sorted(_drain_while(ledger, blocked)) == [(b"a1", 0), (b"a2", 0)]


def _drain_while(ledger: Ledger, blocked: set[str]) -> list[tuple[bytes, int]]:
    out = []
    while (d := ledger.next_request(blocked.__contains__)) is not None:
        out.append((d.token, d.req_id))
    return out


def test_new_connections_of_one_address_never_buy_more_than_its_cap() -> None:
    ledger = Ledger(address_cap=3)
    for conn in range(4):  # fresh routing ids: each its own owner, so its own credits
        key = b"s%d" % conn
        ledger.open(key, 2, owner=b"conn-%d" % conn, address="10.0.0.9")
        ledger.attach(key)
        outcomes = [ledger.admit(Task(key, i, RANGES)) for i in range(2)]
        while ledger.next_request() is not None:  # at readers that never answer
            pass
        ledger.close(key)  # BYE: the requests drain, still charged to the address
        admitted = sum(isinstance(o, Admitted) for o in outcomes)
        assert admitted == [2, 1, 0, 0][conn]
        if admitted < 2:
            refusal = outcomes[-1]
            assert isinstance(refusal, Refusal) and refusal.reason is RefusalReason.OVER_ADDRESS
            assert "--max-sessions-per-address" in refusal.message
    assert ledger.address_charged("10.0.0.9") == 3
    ledger.open(b"other", 2, address="10.0.0.10")
    assert isinstance(ledger.admit(Task(b"other", 0, RANGES)), Admitted)
    assert ledger.address(b"s0") == "10.0.0.9" and ledger.address(b"nobody") is None
    ledger.settle(b"s0", 0)
    assert ledger.address_charged("10.0.0.9") == 2
