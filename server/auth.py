"""The ZAP handler of one server process: admits only the allowed CURVE client keys.

Every server process that binds a client-facing socket (the frontend process and each reader
process) runs one :class:`Gatekeeper` on its context, started before its binds and stopped
before the context terminates. A refused handshake is counted and logged (rate-limited: a peer
can trigger it at will); the client sees ``EVENT_HANDSHAKE_FAILED_AUTH`` on its monitor.

Thread invariant: :attr:`Gatekeeper.refused` is written by the authenticator's thread only; an
int read from another thread is at worst one refusal behind.
"""

from __future__ import annotations

import logging

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85

from dataflow.security import ZAP_DOMAIN, ServerCurve
from dataflow.server.peerlog import RateLimitedLog, quote

log = logging.getLogger("dataflow.server.auth")


class Gatekeeper(ThreadAuthenticator):
    """A :class:`~zmq.auth.thread.ThreadAuthenticator` that counts and logs refusals.

    Attributes:
        refused: CURVE handshakes refused since start.
    """

    def __init__(self, ctx: zmq.Context, curve: ServerCurve) -> None:
        super().__init__(ctx, log=logging.getLogger("dataflow.server.zap"))
        self._curve = curve
        self._address = ""
        self._peer_log = RateLimitedLog(log)
        self.refused = 0

    def start(self) -> None:
        """Start the ZAP thread and load the allowed keys: for this project's ZAP domain
        (pyzmq's ``"*"`` only stands for requests with no domain, so it is loaded too)."""
        super().start()
        for domain in ("*", ZAP_DOMAIN):
            self.configure_curve(domain=domain, location=self._curve.allowed_dir)

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        self._address = msg[3].decode("utf-8", "replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)

    async def _authenticate_curve(self, domain: str, client_key: bytes) -> tuple[bool, bytes]:
        allowed, reason = await super()._authenticate_curve(domain, client_key)
        if not allowed:
            self.refused += 1
            self._peer_log.warning("authentication refused (CURVE) for %s: public key %s not "
                                   "in %s", quote(self._address),
                                   quote(z85.encode(client_key)),
                                   self._curve.allowed_dir)
        return allowed, reason


def start_gatekeeper(ctx: zmq.Context, curve: ServerCurve | None) -> Gatekeeper | None:
    """A started :class:`Gatekeeper` on ``ctx`` (call before binding), None without policy."""
    if curve is None:
        return None
    keeper = Gatekeeper(ctx, curve)
    keeper.start()
    return keeper


def stop_gatekeeper(keeper: Gatekeeper | None) -> None:
    """Stop ``keeper`` (idempotent; nothing for None)."""
    if keeper is not None:
        keeper.stop()
