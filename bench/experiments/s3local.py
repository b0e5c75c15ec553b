"""S3 on loopback for the bench and the tests: a moto server and a counting, optionally
throttling, HTTP proxy in front of it (``moto`` is a dev dependency)."""

from __future__ import annotations

import collections
import http.client
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
from moto.server import ThreadedMotoServer

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1"}
"""Dummy credentials (moto accepts any), for the calling process and the servers it starts."""

SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
            b"<Message>Please reduce your request rate.</Message></Error>")


@contextmanager
def moto_s3() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (an ephemeral port); yields its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint: str):  # noqa: ANN201 - boto3 client types are generated
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


class S3Proxy:
    """Forwards HTTP requests to ``upstream`` on loopback, counting them and the bytes of the
    replies; with ``every`` > 0, answers every ``every``-th GET of an object with
    ``503 SlowDown`` instead; with ``rate`` > 0, as S3 does, each GET of an object beyond
    ``rate`` in the last second (listing and HEAD requests pass).

    Attributes:
        endpoint: the proxy's URL.
        throttled: GETs answered with 503.
        forwarded: requests passed to the upstream.
        bytes_out: body bytes of the replies passed back.
    """

    def __init__(self, upstream: str, every: int = 0, rate: float = 0.0) -> None:
        self.throttled = 0
        self.forwarded = 0
        self.bytes_out = 0
        self._every = every
        self._rate = rate
        self._passed: collections.deque[float] = collections.deque()
        self._gets = 0
        self._lock = threading.Lock()
        host, port = upstream.removeprefix("http://").split(":")
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if self.command == "GET" and "?" not in self.path and proxy._throttle():
                    self.send_response(503)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOWDOWN)))
                    self.end_headers()
                    self.wfile.write(SLOWDOWN)
                    return
                conn = http.client.HTTPConnection(host, int(port), timeout=30)
                try:
                    conn.request(self.command, self.path, body, dict(self.headers))
                    reply = conn.getresponse()
                    data = reply.read()
                finally:
                    conn.close()
                with proxy._lock:
                    proxy.forwarded += 1
                    proxy.bytes_out += len(data)
                self.send_response(reply.status)
                skip = ("transfer-encoding", "connection") + (
                    () if self.command == "HEAD" else ("content-length",))
                for k, v in reply.getheaders():
                    if k.lower() not in skip:
                        self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _throttle(self) -> bool:
        with self._lock:
            self._gets += 1
            now = time.monotonic()
            while self._passed and now - self._passed[0] >= 1.0:
                self._passed.popleft()
            if ((self._every > 0 and self._gets % self._every == 0)
                    or (self._rate > 0 and len(self._passed) >= self._rate)):
                self.throttled += 1
                return True
            if self._rate > 0:
                self._passed.append(now)
            return False

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(10)
