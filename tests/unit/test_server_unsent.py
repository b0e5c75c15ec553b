"""Reply bytes the readers hold unsent: per reader and session, per address, in total."""

from __future__ import annotations

import pytest

from dataflow.errors import InternalError
from dataflow.server.unsent import Unsent


def test_counts_per_address_and_total_and_gates() -> None:
    unsent = Unsent(limit=100, address_limit=40)
    unsent.add(b"w1", b"s1", "10.0.0.1", 30)
    assert not unsent.blocked("10.0.0.1") and not unsent.full()
    unsent.add(b"w2", b"s1", "10.0.0.1", 10)
    assert unsent.blocked("10.0.0.1") and not unsent.blocked("10.0.0.2")
    unsent.add(b"w1", b"s2", "10.0.0.2", 60)
    assert unsent.full() and unsent.total == 100
    unsent.release(b"w1", b"s1", 30)
    assert not unsent.blocked("10.0.0.1") and not unsent.full()
    assert unsent.of_address("10.0.0.1") == 10
    assert (unsent.of_reader(b"w1"), unsent.of_reader(b"w2"), unsent.of_reader(b"w3")) == (
        60, 10, 0)


def test_a_dead_readers_bytes_are_forgotten() -> None:
    unsent = Unsent(limit=100, address_limit=100)
    unsent.add(b"w1", b"s1", "a", 30)
    unsent.add(b"w1", b"s2", "b", 5)
    unsent.add(b"w2", b"s1", "a", 7)
    assert unsent.drop_reader(b"w1") == 35
    assert unsent.total == 7 and unsent.of_address("a") == 7 and unsent.of_address("b") == 0
    assert unsent.of_reader(b"w1") == 0 and unsent.of_reader(b"w2") == 7


def test_releasing_more_than_held_is_an_internal_error() -> None:
    unsent = Unsent(limit=100, address_limit=100)
    unsent.add(b"w1", b"s1", "a", 30)
    with pytest.raises(InternalError, match="released 31 bytes .* while holding 30"):
        unsent.release(b"w1", b"s1", 31)
    with pytest.raises(InternalError, match="while holding 0"):
        unsent.release(b"w2", b"s1", 1)
    unsent.release(b"w1", b"s1", 30)
    assert unsent.total == 0
