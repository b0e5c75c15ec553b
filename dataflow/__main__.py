"""Command line: ``python -m dataflow make-demo ...``, ``... read ...`` and ``... keygen ...``."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from dataflow.batch import batch_len, batch_nbytes
from dataflow.demo import ARROW_KINDS, FORMATS, DemoSpec, describe, make_demo, parse_shape
from dataflow.errors import ConfigError, DataflowError
from dataflow.index.scan import build_index
from dataflow.readers import open_shard
from dataflow.readers.damage import ON_ERROR
from dataflow.security import generate_keys


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dataflow",
        description="dataflow data-plane tools: write demo datasets, read datasets back.",
    )
    sub = p.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "make-demo",
        help="write a deterministic demo dataset",
        description=(
            "Write a deterministic demo dataset (same arguments, same bytes). Every sample has "
            "id (int64, unique 0..total-1 in shard order), label (int64, id % 10), image "
            "(uint8, --image-shape) and text (variable-length str). Shards are named "
            "train-000000.<ext>. A progress bar goes to stderr, a summary to stdout."
        ),
    )
    demo.add_argument("out", help="output directory (created if missing)")
    demo.add_argument("--format", choices=FORMATS, default="arrow",
                      help="arrow: Arrow IPC with a fixed_shape_tensor image; parquet: image as "
                      "fixed_size_list with its shape in field metadata; tar: WebDataset "
                      "(KEY.id, KEY.label, KEY.image.npy, KEY.text). Default: %(default)s")
    demo.add_argument("--shards", type=int, default=8, help="number of shards (default 8)")
    demo.add_argument("--samples-per-shard", type=int, default=512,
                      help="samples per shard; the mean when uneven (default 512)")
    demo.add_argument("--uneven", dest="uneven", action="store_true", default=True,
                      help="draw each shard's size between ~0.25x and ~1.75x of "
                      "--samples-per-shard, seeded (the default)")
    demo.add_argument("--even", dest="uneven", action="store_false",
                      help="every shard gets exactly --samples-per-shard samples")
    demo.add_argument("--seed", type=int, default=0,
                      help="seed for shard sizes and text lengths (default 0)")
    demo.add_argument("--image-shape", default="3,64,64",
                      help="per-sample image shape, comma-separated (default 3,64,64)")
    demo.add_argument("--arrow-kind", choices=ARROW_KINDS, default="file",
                      help="Arrow IPC file (with footer) or stream (as Hugging Face datasets "
                      "writes). Default: %(default)s")
    read = sub.add_parser(
        "read",
        help="read a dataset through the shard readers and report throughput",
        description=(
            "Build the dataset index (resolve specs, open and count every shard, check "
            "schemas), then read every sample through the shard readers in batches and "
            "print samples/s and GB/s."
        ),
    )
    read.add_argument("specs", nargs="+", metavar="SPEC",
                      help="shard paths, directories, globs, brace ranges or fsspec URLs")
    read.add_argument("--batch-size", type=int, default=256, help="samples per read (256)")
    read.add_argument("--cache-dir", default=None,
                      help="where tar indexes and decompressed copies go when they cannot sit "
                      "beside the shard (default $XDG_CACHE_HOME/dataflow or ~/.cache/dataflow)")
    read.add_argument("--on-error", choices=ON_ERROR, default="raise",
                      help="raise on bad samples, or skip and count them (default raise)")
    keygen = sub.add_parser(
        "keygen",
        help="write a CurveZMQ key pair for --curve-secret-key / curve_key",
        description=(
            "Write a CurveZMQ key pair: DIR/NAME.key (public: give it to the peers) and "
            "DIR/NAME.key_secret (secret, mode 0600: keep it on this host). A server uses its "
            "NAME.key_secret with --curve-secret-key and clients use its NAME.key as "
            "server_key; a client uses its NAME.key_secret as curve_key, and its NAME.key goes "
            "into the server's --curve-allowed-keys directory. Existing files are never "
            "overwritten."
        ),
    )
    keygen.add_argument("dir", help="output directory (created if missing)")
    keygen.add_argument("--name", default="dataflow",
                        help="file name stem (default: %(default)s)")
    return p


def _keygen(args: argparse.Namespace) -> int:
    public, secret = generate_keys(args.dir, args.name)
    print(f"public key: {public}\nsecret key: {secret} (mode 0600)")
    return 0


def _make_demo(args: argparse.Namespace) -> int:
    spec = DemoSpec(
        fmt=args.format, shards=args.shards, samples_per_shard=args.samples_per_shard,
        uneven=args.uneven, seed=args.seed, image_shape=parse_shape(args.image_shape),
        arrow_kind=args.arrow_kind,
    )
    result = make_demo(args.out, spec, progress=sys.stderr)
    print(f"{describe(result)} in {args.out}")
    return 0


def _read(args: argparse.Namespace) -> int:
    if args.batch_size < 1:
        raise ConfigError(f"`--batch-size` must be at least 1. Found: {args.batch_size}")
    t0 = time.perf_counter()
    index = build_index(args.specs, cache_dir=args.cache_dir, on_error=args.on_error)
    t1 = time.perf_counter()
    print(f"index: {len(index.shards)} shard(s), {index.total} samples, "
          f"fingerprint {index.fingerprint}, {t1 - t0:.2f} s")
    samples = nbytes = 0
    for url in index.shards:
        with open_shard(url, cache_dir=args.cache_dir, on_error=args.on_error,
                        options=index.read) as r:
            for start in range(0, len(r), args.batch_size):
                batch = r.read(start, min(start + args.batch_size, len(r)))
                samples += batch_len(batch)
                nbytes += batch_nbytes(batch)
    dt = time.perf_counter() - t1
    print(f"read: {samples} samples, {nbytes / 1e9:.3f} GB in {dt:.2f} s: "
          f"{samples / dt:,.0f} samples/s, {nbytes / dt / 1e9:.2f} GB/s")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "keygen":
            return _keygen(args)
        return _make_demo(args) if args.command == "make-demo" else _read(args)
    except DataflowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
