"""Throttling and retries: dataflow's :class:`~dataflow.storage.remote.Remote` (its backoff
and retries; the pace botocore's ``adaptive`` rate limiter's, with one attempt; s3fs's retries
off) beside botocore's own retry modes (``adaptive``: the rate limiter plus retries with
backoff; ``standard``) and s3fs's defaults.

A moto S3 server on loopback behind a proxy that, as S3 does, answers each object GET beyond
``--rate`` in the last second with ``503 SlowDown``. Each client reads ``--reads`` random
ranges of ``--range-kib`` KiB from ``--objects`` objects, ``--threads`` at once (the server's
block pool), every range checked. Then each client reads from an endpoint where nothing
listens: seconds until it gives up.

    python -m dataflow.bench.experiments.s3retry --rate 40 --reads 300
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from s3fs import S3FileSystem

from dataflow.bench.experiments.s3local import CREDENTIALS, S3Proxy, moto_s3, s3_client
from dataflow.storage.remote import Remote, RemoteConfig

BUCKET = "retry"
NOWHERE = "http://127.0.0.1:9"
"""The discard port: nothing listens there, so a connection is refused at once."""
Read = Callable[[str, int, int], bytes]


def _ours(endpoint: str) -> tuple[Read, Callable[[], str]]:
    remote = Remote(RemoteConfig.of({"endpoint_url": endpoint}))

    def stats() -> str:
        s = remote.stats()
        return f"{s['retries']} retries, backoff {s['backoff_s']:.1f} s"

    return (lambda url, a, b: remote.read_range(url, a, b)), stats


def _s3fs(endpoint: str, config: dict[str, Any] | None) -> tuple[Read, Callable[[], str]]:
    """s3fs with botocore's ``retries`` config (its own retry loop off), or s3fs's defaults
    when ``config`` is None."""
    kwargs: dict[str, Any] = {"endpoint_url": endpoint, "skip_instance_cache": True}
    if config is not None:
        kwargs["config_kwargs"] = {"retries": config}
    fs = S3FileSystem(**kwargs)
    if config is not None:
        fs.retries = 1
    return (lambda url, a, b: fs.cat_file(url, start=a, end=b)), lambda: "-"


CLIENTS: dict[str, Callable[[str], tuple[Read, Callable[[], str]]]] = {
    "dataflow Remote (backoff 50 ms..5 s, 8 retries; botocore adaptive pacing)": _ours,
    "botocore adaptive, max_attempts 9": lambda e: _s3fs(e, {"mode": "adaptive",
                                                             "max_attempts": 9}),
    "botocore standard, max_attempts 9": lambda e: _s3fs(e, {"mode": "standard",
                                                             "max_attempts": 9}),
    "s3fs defaults (its loop of 5, botocore's default)": lambda e: _s3fs(e, None),
}


def _load(name: str, make: Callable[[str], tuple[Read, Callable[[], str]]], proxy: S3Proxy,
          data: dict[str, bytes], reads: list[tuple[str, int, int]], threads: int) -> str:
    read, stats = make(proxy.endpoint)
    asked, refused = proxy.forwarded, proxy.throttled
    failed = 0

    def one(r: tuple[str, int, int]) -> bool:
        url, a, b = r
        try:
            got = read(url, a, b)
        except Exception:  # noqa: BLE001 - a read given up is counted, not raised
            return False
        return got == data[url][a:b]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        ok = list(pool.map(one, reads))
    seconds = time.perf_counter() - t0
    failed = ok.count(False)
    attempts = proxy.forwarded - asked + proxy.throttled - refused
    return (f"| {name} | {seconds:.2f} | {attempts} | {proxy.throttled - refused} | "
            f"{failed} of {len(reads)} | {stats()} |")


def _nowhere(name: str, make: Callable[[str], tuple[Read, Callable[[], str]]],
             url: str) -> str:
    read, _ = make(NOWHERE)
    t0 = time.perf_counter()
    try:
        read(url, 0, 1)
        outcome = "read?!"
    except Exception as e:  # noqa: BLE001 - the error is the finding
        outcome = type(e).__name__
    return f"| {name} | {time.perf_counter() - t0:.2f} | {outcome} |"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.s3retry",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=40.0,
                   help="object GETs the store accepts per second (default: %(default)s)")
    p.add_argument("--reads", type=int, default=300, help="ranges read (default: %(default)s)")
    p.add_argument("--range-kib", type=int, default=256,
                   help="KiB per range (default: %(default)s)")
    p.add_argument("--objects", type=int, default=8, help="objects (default: %(default)s)")
    p.add_argument("--object-mib", type=int, default=4,
                   help="MiB per object (default: %(default)s)")
    p.add_argument("--threads", type=int, default=16,
                   help="reads at once (default: %(default)s, the server's block pool)")
    p.add_argument("--only", default=None, metavar="TEXT",
                   help="run only the clients whose name holds TEXT")
    args = p.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    os.environ.update(CREDENTIALS)
    rng = np.random.default_rng(0)
    size, span = args.object_mib << 20, args.range_kib << 10
    data = {f"s3://{BUCKET}/o{i}": rng.bytes(size) for i in range(args.objects)}
    urls = sorted(data)
    reads = []
    for _ in range(args.reads):
        start = int(rng.integers(0, size - span))
        reads.append((urls[int(rng.integers(len(urls)))], start, start + span))
    clients = {k: v for k, v in CLIENTS.items() if args.only is None or args.only in k}
    print(f"{args.reads} reads of {args.range_kib} KiB from {args.objects} x {args.object_mib} "
          f"MiB objects, {args.threads} at once; the store takes {args.rate:g} GETs/s and "
          "answers the others 503 SlowDown\n")
    print("| client | seconds | GETs sent | 503s | reads given up | client's counters |\n"
          "| --- | --- | --- | --- | --- | --- |")
    with moto_s3() as endpoint:
        client = s3_client(endpoint)
        client.create_bucket(Bucket=BUCKET)
        for url, body in data.items():
            client.put_object(Bucket=BUCKET, Key=url.rsplit("/", 1)[1], Body=body)
        for name, make in clients.items():
            with S3Proxy(endpoint, rate=args.rate) as proxy:
                print(_load(name, make, proxy, data, reads, args.threads), flush=True)
    print(f"\n| client | seconds until a read from {NOWHERE} gives up | error |\n"
          "| --- | --- | --- |")
    for name, make in clients.items():
        print(_nowhere(name, make, urls[0]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
