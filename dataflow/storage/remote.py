"""The remote byte layer: storage options, ranged reads with retries, one-line errors.

Every byte of a remote shard (``s3://``, ``gs://``, ``http(s)://``, any fsspec URL) is read
through :class:`Remote`, one per process and :class:`RemoteConfig` (:func:`session`):

* **storage options** (``--storage-option KEY=VALUE``, ``DATAFLOW_STORAGE_OPTIONS``) are passed
  to the fsspec filesystem of every remote URL (``endpoint_url``, ``anon``, ``key``...);
* **retries** (:meth:`Remote.call`, every request: ranged reads, listings, ``info``): a
  throttling reply (S3 ``503 SlowDown``, HTTP 503/429) is retried with exponential backoff
  (:class:`~dataflow.storage.throttle.Backoff`); a connection failure only
  :data:`CONNECT_RETRIES` times, so a wrong endpoint fails fast; anything else never;
* **pacing**, for S3: botocore's ``adaptive`` retry mode with one attempt, i.e. its client-side
  rate limiter (lowered on each throttling reply, raised as replies come back) and none of its
  retries, and s3fs's retry loop off (unless the options set ``config_kwargs.retries``): one
  place retries and counts, and a wrong endpoint fails in about a second, not after botocore's
  retries of a refused connection (56-75 s: bench/RESULTS.md, ``s3retry``);
* **errors** become one line naming the URL, the endpoint or bucket and the likely fix
  (:func:`describe`).

Thread-safe: the readers of one process (the server's indexing threads) share one
:class:`Remote`.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import fsspec
from fsspec import AbstractFileSystem

from dataflow.checks import check_int
from dataflow.errors import ConfigError, RangeUnsupported, RemoteFailure
from dataflow.storage.remoteerrors import describe, is_connect_failure, is_throttle
from dataflow.storage.throttle import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_CACHE_BYTES = 8 << 30
DEFAULT_MAX_CONCURRENCY = 16
CONNECT_RETRIES = 3
ENV_STORAGE_OPTIONS = "DATAFLOW_STORAGE_OPTIONS"
"""Environment variable holding storage options as a JSON object (read at entry points)."""
_S3 = ("s3", "s3a")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)
def parse_size(text: str) -> int:
    """Bytes from ``"1000"``, ``"512M"``, ``"8G"``, ``"1.5GiB"`` (binary units).

    Raises:
        ConfigError: not a size.
    """
    m = _SIZE.match(text)
    if not m:
        raise ConfigError(f"not a size in bytes (like 512M or 8G). Found: {text!r}")
    unit = m.group(2).lower()
    return int(float(m.group(1)) * (1024 ** ("kmgt".index(unit) + 1) if unit else 1))


def parse_storage_options(pairs: Sequence[str], env_json: str | None = None) -> dict[str, Any]:
    """Storage options from ``KEY=VALUE`` flags over a JSON object from the environment.

    A value is read as JSON when it parses (``true``, ``3``, ``{"a": 1}``), else kept as a
    string; a dotted key sets a nested option (``client_kwargs.region_name=eu-west-1``).

    Raises:
        ConfigError: a pair without ``=``, an empty key, or environment text that is not a
            JSON object (naming :data:`ENV_STORAGE_OPTIONS`).
    """
    out: dict[str, Any] = {}
    if env_json:
        try:
            out = json.loads(env_json)
        except ValueError as e:
            raise ConfigError(f"{ENV_STORAGE_OPTIONS} is not valid JSON: {e}") from e
        if not isinstance(out, dict):
            raise ConfigError(f"{ENV_STORAGE_OPTIONS} must be a JSON object. Found: {env_json!r}")
    for pair in pairs:
        key, eq, text = pair.partition("=")
        if not eq or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--storage-option must look like KEY=VALUE. Found: {pair!r}")
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--storage-option {pair!r}: {p!r} is not a nested option")
        node[leaf] = value
    return out


@dataclass(frozen=True)
class RemoteConfig:
    """How remote shards are reached (picklable: sent to every reader process).

    Attributes:
        storage_options: fsspec storage options as a JSON object (see :attr:`options`).
        cache_bytes: size limit of the local cache of remote bytes.
        max_concurrency: threads fetching blocks in parallel per process.
        max_retries: retries of a throttled request before giving up.
    """

    storage_options: str = "{}"
    cache_bytes: int = DEFAULT_CACHE_BYTES
    max_concurrency: int = DEFAULT_MAX_CONCURRENCY
    max_retries: int = 8

    def __post_init__(self) -> None:
        try:
            opts = json.loads(self.storage_options)
        except ValueError as e:
            raise ConfigError(f"`storage_options` must be a JSON object: {e}") from e
        if not isinstance(opts, dict):
            raise ConfigError(f"`storage_options` must be a JSON object. Found: "
                              f"{self.storage_options!r}")
        for name, lo, hi in (("cache_bytes", 1 << 20, None), ("max_concurrency", 1, 1024),
                             ("max_retries", 0, None)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo, hi))

    @classmethod
    def of(cls, options: Mapping[str, Any], **kwargs: Any) -> RemoteConfig:
        return cls(storage_options=json.dumps(dict(options), sort_keys=True), **kwargs)

    @property
    def options(self) -> dict[str, Any]:
        return dict(json.loads(self.storage_options))


class Remote:
    """Reads remote bytes under one :class:`RemoteConfig`. Thread-safe.

    Attributes:
        pool: threads for parallel block fetches (``max_concurrency`` of them).
        retries: retries made (throttled or failed to connect).
        throttles: throttling replies met.
        waited_s: seconds spent backing off.
    """

    def __init__(self, config: RemoteConfig, *, sleep: Callable[[float], None] = time.sleep,
                 draw: Callable[[], float] = random.random) -> None:
        self.config = config
        self.options = config.options
        self.backoff = Backoff(max_retries=config.max_retries)
        self.retries = 0
        self.throttles = 0
        self.waited_s = 0.0
        self._counts = threading.Lock()
        self.pool = ThreadPoolExecutor(config.max_concurrency, thread_name_prefix="remote")
        self._sleep = sleep
        self._draw = draw

    def fs(self, url: str) -> tuple[AbstractFileSystem, str]:
        """The filesystem of ``url`` under the storage options, and the path in it.

        Raises:
            ConfigError: the protocol is unknown or its package is missing, or the options
                do not fit it.
        """
        options = self.config.options
        s3 = url.split("://", 1)[0] in _S3
        if s3:
            kwargs = options.setdefault("config_kwargs", {})
            kwargs.setdefault("retries", {"mode": "adaptive", "total_max_attempts": 1})
        try:
            fs, path = fsspec.core.url_to_fs(url, **options)
        except (ImportError, ValueError, TypeError) as e:
            raise ConfigError(f"{url}: cannot open the filesystem with the storage options "
                              f"{sorted(self.options)}: {e}") from e
        if s3:
            fs.retries = 1  # s3fs's own retry loop (an attribute, not an option)
        return fs, path

    def call(self, url: str, fn: Callable[[], T]) -> T:
        """``fn()``, retried with backoff on throttling and on connection failures.

        Raises:
            RemoteFailure: ``fn`` failed for good; the message is one line.
        """
        retry = 0
        while True:
            try:
                return fn()
            except Exception as e:  # noqa: BLE001 - classified, then retried or raised
                throttled = is_throttle(e)
                limit = self.backoff.max_retries if throttled else CONNECT_RETRIES
                if throttled:
                    with self._counts:
                        self.throttles += 1
                elif not is_connect_failure(e):
                    limit = 0
                if retry >= limit:
                    tried = f" (after {retry + 1} attempts)" if retry else ""
                    raise RemoteFailure(url, describe(e, url, self.options) + tried) from e
                wait = self.backoff.delay(retry, self._draw())
                log.debug("%s: %s; retry %d in %.2f s", url, "throttled" if throttled
                          else "connection failed", retry + 1, wait)
                with self._counts:
                    self.retries += 1
                    self.waited_s += wait
                self._sleep(wait)
                retry += 1

    def info(self, url: str) -> dict[str, Any]:
        fs, path = self.fs(url)
        return dict(self.call(url, lambda: fs.info(path)))

    def read_range(self, url: str, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of ``url`` (fewer only at the end of the file).

        Raises:
            RangeUnsupported: the server sent more than asked (it ignores ``Range``).
            RemoteFailure: the read failed for good.
        """
        fs, path = self.fs(url)
        data = self.call(url, lambda: fs.cat_file(path, start=start, end=stop))
        if len(data) > stop - start:
            raise RangeUnsupported(f"the server ignores HTTP Range requests (asked for "
                                   f"{stop - start} bytes, got {len(data)})")
        return bytes(data)

    def stats(self) -> dict[str, float]:
        with self._counts:
            return {"retries": self.retries, "backoff_s": round(self.waited_s, 3),
                    "throttles": self.throttles}


@functools.lru_cache(maxsize=8)
def session(config: RemoteConfig) -> Remote:
    """This process's :class:`Remote` for ``config`` (one per config, made on first use)."""
    return Remote(config)


# A forked child must not use its parent's Remote: the pool's threads do not exist there.
os.register_at_fork(after_in_child=session.cache_clear)
