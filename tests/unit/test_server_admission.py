"""Whether a HELLO opens a session, with how many credits and samples a request: a pure
decision over the server's flags and how many sessions it and the peer's address hold."""

from __future__ import annotations

import pytest

from dataflow.server import ServerConfig
from dataflow.server.admission import Grant, Refused, admit_hello
from dataflow.wire import ErrorKind, Hello

CONFIG = ServerConfig(("x",), max_sessions=4, max_sessions_per_address=2, max_credits=8,
                      max_request_samples=1000, max_window_samples=4096)
SERVED = ("id", "image", "meta.source")


def _admit(msg: Hello, *, renewing: bool = False, sessions: int = 0,
           of_address: int = 0) -> Grant | Refused:
    return admit_hello(msg, CONFIG, SERVED, renewing=renewing, sessions=sessions,
                       of_address=of_address)


@pytest.mark.parametrize("msg, grant", [
    (Hello(4), Grant(4, 1000)),  # no batch_size: --max-request-samples a request
    (Hello(100), Grant(4, 1000)),  # window: 4096 // 1000 samples' worth of credits
    (Hello(100, batch_size=256), Grant(8, 256)),  # --max-credits
    (Hello(3, batch_size=256), Grant(3, 256)),
    (Hello(5, batch_size=1000), Grant(4, 1000)),
    (Hello(1, columns=("image", "meta")), Grant(1, 1000)),  # a parent names its fields
    (Hello(2, batch_size=100, group=4), Grant(2, 400, 4)),  # 4 batches a request
    (Hello(8, batch_size=300, group=8), Grant(4, 1000, 3)),  # as many as 1000 samples hold
    (Hello(8, batch_size=1000, group=8), Grant(4, 1000, 1)),
    (Hello(8, group=8), Grant(4, 1000, 1)),  # no batch_size: one batch a request
])
def test_a_session_gets_its_credits_within_every_cap(msg: Hello, grant: Grant) -> None:
    assert _admit(msg) == grant


def test_at_least_one_credit_whatever_the_window() -> None:
    config = ServerConfig(("x",), max_request_samples=1000, max_window_samples=10)
    assert admit_hello(Hello(8), config, SERVED, renewing=False, sessions=0,
                       of_address=0) == Grant(1, 1000)


@pytest.mark.parametrize("msg, words", [
    (Hello(1, batch_size=1001), "`batch_size` 1001 exceeds this server's "
                                "--max-request-samples 1000"),
    (Hello(1, columns=("id", "label")), "field(s) ['label'] this server does not serve"),
])
def test_a_hello_asking_more_than_the_server_serves_is_a_protocol_refusal(
        msg: Hello, words: str) -> None:
    for renewing in (False, True):
        refused = _admit(msg, renewing=renewing)
        assert isinstance(refused, Refused) and refused.kind is ErrorKind.PROTOCOL
        assert refused.counter == "refused" and words in refused.message


@pytest.mark.parametrize("sessions, of_address, counter, flag", [
    (4, 0, "sessions_refused", "--max-sessions)"),
    (3, 2, "address_sessions_refused", "--max-sessions-per-address"),
])
def test_a_new_session_beyond_the_caps_is_busy_and_a_renewed_one_is_not(
        sessions: int, of_address: int, counter: str, flag: str) -> None:
    refused = _admit(Hello(2), sessions=sessions, of_address=of_address)
    assert isinstance(refused, Refused) and refused.kind is ErrorKind.SERVER_BUSY
    assert refused.counter == counter and flag in refused.message
    assert _admit(Hello(2), sessions=sessions, of_address=of_address, renewing=True) \
        == Grant(2, 1000)
    assert _admit(Hello(2), sessions=sessions - 1, of_address=of_address - 1) == Grant(2, 1000)
