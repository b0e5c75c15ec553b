"""Startup of a server on an S3 dataset: seconds to ready, requests and bytes fetched before
ready, bytes left in the cache.

A moto S3 server on loopback holds ``--shards`` WebDataset tars; a counting proxy in front of
it measures the bytes the server fetches. The server is started twice on one cache directory:
cold (empty cache) and warm (indexes cached). With ``--baseline DIR`` (an importable tree of
an older ``dataflow``, see bench/RESULTS.md) the same runs are made with that code first, in
the same run, for a ratio.

    python -m dataflow.bench.experiments.s3start --shards 16 --samples 256 --baseline /tmp/base
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence

from dataflow.bench.experiments.s3local import CREDENTIALS, S3Proxy, moto_s3, s3_client
from dataflow.demo import DemoSpec, make_demo, parse_shape
from dataflow.server import launch

BUCKET = "bench"


def _disk(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def _start(label: str, proxy: S3Proxy, cache: str, baseline: str | None) -> str:
    """Start a server, stop it once ready; one result line. The baseline has no
    ``--storage-option``: it reaches the endpoint through ``FSSPEC_S3_ENDPOINT_URL``."""
    env = dict(CREDENTIALS)
    args = ["--cache-dir", cache]
    if baseline:
        env.update(PYTHONPATH=baseline, FSSPEC_S3_ENDPOINT_URL=proxy.endpoint)
    else:
        args += ["--storage-option", f"endpoint_url={proxy.endpoint}"]
    before, asked = proxy.bytes_out, proxy.forwarded
    t0 = time.perf_counter()
    with launch([f"s3://{BUCKET}/*.tar"], workers=1, env=env, timeout=600,
                extra_args=args) as server:
        ready = time.perf_counter() - t0
        fetched = proxy.bytes_out - before
        requests = proxy.forwarded - asked
        samples = server.ready["samples"]
    return (f"| {label} | {ready:.2f} | {requests} | {fetched / 2**20:.1f} "
            f"| {_disk(cache) / 2**20:.1f} | {samples} |")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.s3start",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=16, help="tar shards (default: %(default)s)")
    p.add_argument("--samples", type=int, default=256,
                   help="samples per shard (default: %(default)s)")
    p.add_argument("--image", default="3,64,64", help="image shape (default: %(default)s)")
    p.add_argument("--baseline", default=None, metavar="DIR",
                   help="directory holding an older importable `dataflow` to compare with")
    args = p.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's per-request lines
    os.environ.update(CREDENTIALS)
    work = tempfile.mkdtemp(prefix="s3start-")
    try:
        demo = make_demo(os.path.join(work, "src"),
                         DemoSpec(fmt="tar", shards=args.shards, samples_per_shard=args.samples,
                                  uneven=False, image_shape=parse_shape(args.image)),
                         progress=None)
        size = sum(os.path.getsize(x) for x in demo.paths)
        print(f"{args.shards} tar shards, {demo.total} samples, {size / 2**20:.1f} MiB on S3 "
              "(moto on loopback)\n")
        print("| code, start | seconds to ready | requests before ready | MiB fetched before ready "
              "| MiB in cache dir | samples |\n| --- | --- | --- | --- | --- | --- |")
        with moto_s3() as endpoint, S3Proxy(endpoint) as proxy:
            client = s3_client(endpoint)
            client.create_bucket(Bucket=BUCKET)
            for x in demo.paths:
                client.upload_file(str(x), BUCKET, os.path.basename(x))
            runs: list[tuple[str, str | None]] = [("this", None)]
            if args.baseline:
                runs.insert(0, ("baseline", args.baseline))
            for label, baseline in runs:
                cache = os.path.join(work, f"cache-{label}")
                for start in ("cold", "warm"):
                    print(_start(f"{label}, {start}", proxy, cache, baseline), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
