"""Command line: ``python -m dataflow.bench demo|run|sweep|startup|fuzz`` (console script
``dataflow-bench``)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

from dataflow.bench.config import LOADERS, STEP_MODES, BenchConfig
from dataflow.bench.data import ensure_demo
from dataflow.bench.fuzz import ATTACKS, TARGETS, FuzzConfig, run_fuzz
from dataflow.bench.session import run_config
from dataflow.bench.startup import StartupConfig, run_startup
from dataflow.bench.sweep import AXES, run_sweep
from dataflow.demo import FORMATS
from dataflow.errors import DataflowError

QUICK = {"warmup": 5, "steps": 100, "repeats": 1}
# The demo's headline is quoted from interleaved repeats, so a loaded machine shows its noise.
DEMO_TIMING = {"warmup": 5, "steps": 100, "repeats": 3}
DEMO_DEFAULTS = {"shards": 8, "samples_per_shard": 1000, "image_shape": (3, 64, 64)}

STEP_HELP = (
    "step mode. gpu: calibrated fp16 matmul chain on the default CUDA stream, wait and "
    "transfer measured on the GPU with CUDA events (needs CUDA). sleep: time.sleep(step), the "
    "trainer's CPU stays free as during a GPU step. cpu: busy numpy loop, one trainer core "
    "busy. auto: gpu with CUDA, else sleep. Default: %(default)s"
)


def _csv(kind: type, text: str) -> list:
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__}s: {e}") from e


def _loaders(text: str) -> list[str]:
    names = _csv(str, text)
    unknown = [n for n in names if n not in LOADERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown loader {unknown[0]!r}; choose from {LOADERS}")
    return names


def _common(p: argparse.ArgumentParser, timing: dict[str, int] | None = None) -> None:
    """The options of demo, run and sweep; ``timing``: other defaults of warm-up, steps and
    repeats."""
    d = BenchConfig(data=("x",))
    t = {"warmup": d.warmup, "steps": d.steps, "repeats": d.repeats, **(timing or {})}
    g = p.add_argument_group("what to compare")
    g.add_argument("data", nargs="*",
                   help="dataset specs (dirs, globs, brace ranges, paths) of Arrow, Parquet or "
                   "tar shards; none: the demo dataset of --format, written once under --out")
    g.add_argument("--format", choices=FORMATS, default="tar",
                   help="demo dataset format when no DATA is given (default: %(default)s)")
    g.add_argument("--shards", type=int, default=DEMO_DEFAULTS["shards"],
                   help="demo dataset shards (default: %(default)s)")
    g.add_argument("--samples-per-shard", type=int, default=DEMO_DEFAULTS["samples_per_shard"],
                   help="demo dataset samples per shard (default: %(default)s)")
    g.add_argument("--image-shape", type=lambda t: tuple(_csv(int, t)),
                   default=DEMO_DEFAULTS["image_shape"], metavar="C,H,W",
                   help="demo dataset image shape, uint8 (default: 3,64,64; 3,224,224 is the "
                   "large-sample preset, 150 KB a sample)")
    g.add_argument("--loaders", type=_loaders, default=list(d.loaders),
                   help=f"comma-separated, from {','.join(LOADERS)}; peers not installed are "
                   f"skipped with a message (default: {','.join(d.loaders)})")
    g.add_argument("--batch-size", type=int, default=d.batch_size,
                   help="samples per batch (default: %(default)s)")
    g.add_argument("--workers", type=int, default=d.workers,
                   help="loading processes per loader, the shared CPU budget: torch "
                   "num_workers, dataflow reader processes over all servers, peer workers "
                   "(default: %(default)s)")
    g.add_argument("--servers", type=int, default=d.servers,
                   help="local dataflow servers to start; --workers is split evenly "
                   "(default: %(default)s)")
    g.add_argument("--endpoints", type=lambda t: _csv(str, t), default=[],
                   help="comma-separated endpoints of running dataflow servers (tcp://h:p); "
                   "none are started then")
    g.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                   help="read in storage order (default: every loader shuffles)")
    g.add_argument("--seed", type=int, default=d.seed, help="shuffle seed (default: %(default)s)")
    g.add_argument("--prefetch", type=int, default=d.prefetch,
                   help="batches each loader prepares ahead (default: %(default)s)")
    g.add_argument("--io-threads", type=int, default=d.io_threads,
                   help="ZeroMQ I/O threads of dataflow's DataLoader, 1 to 64; large batches "
                   "(--image-shape 3,224,224) receive faster with 2 or more "
                   "(default: %(default)s, the DataLoader's)")
    s = p.add_argument_group("the training step and the measurement")
    s.add_argument("--step", choices=STEP_MODES, default=d.step, help=STEP_HELP)
    s.add_argument("--step-ms", type=float, default=d.step_ms,
                   help="target step time in ms (default: %(default)s)")
    s.add_argument("--warmup", type=int, default=t["warmup"],
                   help="warm-up steps, excluded (default: %(default)s)")
    s.add_argument("--steps", type=int, default=t["steps"],
                   help="measured steps per run (default: %(default)s)")
    s.add_argument("--repeats", type=int, default=t["repeats"],
                   help="runs per loader, interleaved (dataflow, torch, dataflow, ...); medians "
                   "reported, with the range over the repeats (default: %(default)s)")
    s.add_argument("--quick", action="store_true",
                   help=f"short run: warm-up {QUICK['warmup']}, {QUICK['steps']} steps, "
                   f"{QUICK['repeats']} repeat")
    s.add_argument("--inflight", type=int, default=d.inflight,
                   help="gpu mode: steps queued ahead of the GPU (default: %(default)s)")
    s.add_argument("--timeout", type=float, default=d.timeout_s,
                   help="seconds a loader may take for one batch (default: %(default)s)")
    o = p.add_argument_group("output")
    o.add_argument("--out", default=d.out_dir,
                   help="directory for JSON, PNG, demo data and peer conversions "
                   "(default: %(default)s)")
    o.add_argument("--tag", default=None, help="base name of the output files")
    o.add_argument("--markdown", action="store_true",
                   help="also print the table as markdown, every column (for bench/RESULTS.md)")
    o.add_argument("--wide", action="store_true",
                   help="print every column of the table: batches/s, p95, loader CPU, RSS, time "
                   "to first batch (default: GPU-idle, samples/s, the ratio, wait p50/p99, "
                   "trainer CPU; the JSON has every figure)")


def build_parser() -> argparse.ArgumentParser:
    """The ``python -m dataflow.bench`` argument parser."""
    p = argparse.ArgumentParser(
        prog="python -m dataflow.bench",
        description=(
            "Measure GPU-idle time: a training loop with a step of controlled cost consumes "
            "batches from each loader in turn (dataflow, torch's DataLoader, installed peers) "
            "on the same data with the same batch size and CPU budget, and reports per loader "
            "the GPU-idle fraction (data stall / wall time), samples/s, wait percentiles, CPU "
            "and peak RSS, as a table, a JSON file of every step and a PNG plot."
        ),
    )
    sub = p.add_subparsers(dest="command", required=True,
                           metavar="{demo,run,sweep,startup,fuzz}")
    demo = sub.add_parser(
        "demo", help="the first thing to run: demo data, 2 local servers, dataflow vs torch",
        description="Write demo shards (cached under --out), start local dataflow servers and "
        "compare dataflow with torch's DataLoader (webdataset for tar) on them with a 10 ms "
        f"sleep step: {DEMO_TIMING['repeats']} interleaved repeats of short runs "
        f"({DEMO_TIMING['steps']} measured steps each), the headline quoted as their median "
        "with the range. Finishes in about 20 s on 2 cores.")
    _common(demo, DEMO_TIMING)
    run = sub.add_parser("run", help="compare loaders on one configuration",
                         description="Compare loaders on one configuration.")
    _common(run)
    sweep = sub.add_parser(
        "sweep", help="compare loaders over step times or server counts",
        description="Run the comparison at several values of one setting and plot GPU-idle "
        "fraction against it: where each loader stops keeping up.")
    _common(sweep)
    sweep.add_argument("--axis", choices=AXES, default="step-ms",
                       help="setting to sweep. servers: local servers of --workers/--servers "
                       "readers each, and every loader gets servers x that many workers (the "
                       "budget grows with the servers); servers-split: --workers in total for "
                       "every loader, dataflow's split evenly over the servers (12: 1x12, "
                       "2x6, 4x3; --servers is ignored) (default: %(default)s)")
    sweep.add_argument("--values", type=lambda t: _csv(float, t), default=[0.0, 5.0, 20.0],
                       help="comma-separated values of the axis (default: 0,5,20)")
    _startup_parser(sub)
    _fuzz_parser(sub)
    return p


def _fuzz_parser(sub: argparse._SubParsersAction) -> None:
    d = FuzzConfig()
    fz = sub.add_parser(
        "fuzz", help="fuzz real servers for minutes (both sockets, raw ZMTP, floods)",
        description="Start a real server (in clear text, then with CURVE keys) and, for "
        "--minutes, send it structure-aware mutated wire messages on its client socket and "
        "its readers' data sockets, raw ZMTP (mutated greetings, READYs and commands, partial "
        "frames, resets) and floods of empty messages from many connections, while a "
        "DataLoader reads epochs. Fails (exit 1) when a server process dies or restarts, an "
        "epoch misses or repeats a sample, a reader answers otherwise than predicted, the "
        "malformed count leaves its predicted range, or a peak RSS grows past the bound.")
    fz.add_argument("--minutes", type=float, default=d.minutes,
                    help="attack time shared by the targets (default: %(default)s)")
    fz.add_argument("--seed", type=int, default=d.seed,
                    help="seed of each attack's first round; round r uses seed + r "
                    "(default: %(default)s)")
    fz.add_argument("--seeds", type=int, default=d.seeds,
                    help="most rounds (seeds) per attack and target; 0: as many as the "
                    "time allows (default: %(default)s)")
    fz.add_argument("--attacks", type=lambda t: tuple(_csv(str, t)), default=d.attacks,
                    help=f"comma-separated, from {','.join(ATTACKS)} (default: all)")
    fz.add_argument("--targets", type=lambda t: tuple(_csv(str, t)), default=d.targets,
                    help=f"comma-separated, from {','.join(TARGETS)} (default: both)")
    fz.add_argument("--workers", type=int, default=d.workers,
                    help="reader processes per server (default: %(default)s)")
    fz.add_argument("--flood-hold", type=float, default=d.flood_hold,
                    help="most seconds a flood's connections stay open and silent "
                    "(default: %(default)s)")
    fz.add_argument("--answer-timeout", type=float, default=d.answer_timeout,
                    help="seconds a reader or the DataLoader may take for one answer "
                    "(default: %(default)s)")
    fz.add_argument("--rss-slack-mib", type=float, default=d.rss_slack_mib,
                    help="allowance of each server process over the memory bound of its "
                    "flags (docs/architecture.md's formula), for Python's heap and the allocator "
                    "(default: %(default)s)")


def _run_fuzz(args: argparse.Namespace) -> int:
    cfg = FuzzConfig(minutes=args.minutes, seed=args.seed, seeds=args.seeds,
                     attacks=args.attacks, targets=args.targets, workers=args.workers,
                     flood_hold=args.flood_hold, answer_timeout=args.answer_timeout,
                     rss_slack_mib=args.rss_slack_mib)
    return 0 if run_fuzz(cfg) else 1


def _startup_parser(sub: argparse._SubParsersAction) -> None:
    d = StartupConfig()
    st = sub.add_parser(
        "startup", help="time to ready and to first batch on thousands of small tar shards",
        description="Write small tar shards (once, under --out) and time, per shard count, "
        "from starting a dataflow server to its ready line and to a client's first batch: "
        "cold (no index at all), with tar indexes only, and with the dataset index cache; "
        "against torch DataLoader + webdataset to its first batch on the same shards.")
    st.add_argument("--shard-counts", type=lambda t: _csv(int, t), default=list(d.shard_counts),
                    help="comma-separated dataset sizes in shards (default: "
                    f"{','.join(map(str, d.shard_counts))})")
    st.add_argument("--samples-per-shard", type=int, default=d.samples_per_shard,
                    help="samples per tar shard (default: %(default)s)")
    st.add_argument("--batch-size", type=int, default=d.batch_size,
                    help="samples per batch (default: %(default)s)")
    st.add_argument("--workers", type=int, default=d.workers,
                    help="server reader processes and torch DataLoader workers "
                    "(default: %(default)s)")
    st.add_argument("--repeats", type=int, default=d.repeats,
                    help="runs per scenario, interleaved; medians reported "
                    "(default: %(default)s)")
    st.add_argument("--timeout", type=float, default=d.timeout_s,
                    help="seconds to wait for a ready line or a first batch "
                    "(default: %(default)s)")
    st.add_argument("--out", default=d.out_dir,
                    help="directory for the shards and startup.json (default: %(default)s)")


def _run_startup(args: argparse.Namespace) -> int:
    cfg = StartupConfig(
        shard_counts=tuple(args.shard_counts), samples_per_shard=args.samples_per_shard,
        batch_size=args.batch_size, workers=args.workers, repeats=args.repeats,
        timeout_s=args.timeout, out_dir=args.out)
    run_startup(cfg)
    return 0


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The :class:`BenchConfig` for parsed arguments, writing the demo data when needed."""
    data = list(args.data)
    if not data:
        shape = ("" if args.image_shape == DEMO_DEFAULTS["image_shape"]
                 else "-" + "x".join(map(str, args.image_shape)))
        demo_dir = os.path.join(args.out, f"demo-{args.format}-{args.shards}x"
                                f"{args.samples_per_shard}{shape}")
        print(f"demo data: {demo_dir}", flush=True)
        data = [ensure_demo(demo_dir, fmt=args.format, shards=args.shards,
                            samples_per_shard=args.samples_per_shard,
                            image_shape=args.image_shape)]
    timing = dict(QUICK) if args.quick else {
        "warmup": args.warmup, "steps": args.steps, "repeats": args.repeats}
    # servers-split sweeps set the server count per point from --workers alone.
    servers = 1 if getattr(args, "axis", None) == "servers-split" else args.servers
    return BenchConfig(
        data=tuple(data), loaders=tuple(args.loaders), batch_size=args.batch_size,
        workers=args.workers, servers=servers, endpoints=tuple(args.endpoints),
        step=args.step, step_ms=args.step_ms, shuffle=args.shuffle, seed=args.seed,
        prefetch=args.prefetch, inflight=args.inflight, io_threads=args.io_threads,
        timeout_s=args.timeout,
        out_dir=args.out, **timing,
    )


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m dataflow.bench`` / ``dataflow-bench``; returns the exit code.

    SIGTERM exits through the loaders' ``close()``, so the servers the bench started stop too.

    Exit codes: 0 when every loader that could run ran, 1 when one failed, 2 on bad input.
    """
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        if args.command == "startup":
            return _run_startup(args)
        if args.command == "fuzz":
            return _run_fuzz(args)
        cfg = config_from_args(args)
        if args.command == "sweep":
            doc = run_sweep(cfg, args.axis, args.values, tag=args.tag or "sweep",
                            wide=args.wide)
            return 1 if any(point["failed"] for point in doc["points"]) else 0
        result = run_config(cfg, tag=args.tag or args.command, wide=args.wide)
    except DataflowError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.markdown:
        from dataflow.bench.report import format_table

        print("\n" + format_table(result.outcome, cfg.loaders, markdown=True))
    return 1 if result.outcome.failed else 0


if __name__ == "__main__":
    sys.exit(main())
