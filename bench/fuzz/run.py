"""``python -m dataflow.bench fuzz``: a long fuzz of real servers, outside the test suite.

For each target (a server in clear text, then one with CURVE keys), a real server with 2 reader
processes serves a small demo dataset while, for its share of ``--minutes``, the attacks of
:mod:`dataflow.bench.fuzz.attacks` run side by side, one thread each, round after round (round
``r`` of an attack draws from seed ``--seed + r``), and a legitimate DataLoader reads epoch
after epoch. Then it checks, and any miss is a violation (exit status 1):

* the frontend and its readers are the processes that started (none died, was restarted or
  aborted; STATS ``worker_restarts`` is 0), and the server stops cleanly on SIGTERM;
* every epoch the DataLoader read held every sample exactly once;
* every message to a reader's data socket got the answer the oracle predicts;
* STATS ``malformed`` is at least what the oracle predicts for the structure-aware messages,
  and at most that plus the complete messages sent raw;
* the frontend's peak RSS grew by at most the bound for the server's flags
  (docs/architecture.md, Memory; :func:`dataflow.server.memory.memory_bound`), the readers'
  together by at most theirs, each process with ``--rss-slack-mib`` more for Python's heap and
  the allocator. The server runs with caps tighter than the defaults (:data:`CAPS`), so that
  bound is a few hundred MiB.

It prints, per target, what was sent (per attack and kind), the DataLoader's epochs, the STATS
counters (refusals, malformed, cuts, expiries) and the RSS peaks, then PASS or FAIL.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import zmq

from dataflow import wire
from dataflow.bench.fuzz.attacks import (
    Round,
    Tally,
    Target,
    data_round,
    flood_round,
    router_round,
    zmtp_round,
)
from dataflow.bench.procs import alive, peak_rss_bytes
from dataflow.checks import check_int
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import ConfigError
from dataflow.index import DatasetIndex
from dataflow.security import ClientCurve, generate_keys, secure_client
from dataflow.server import ServerHandle, launch
from dataflow.server.flags import parse_args
from dataflow.server.memory import MemoryBound, memory_bound

ATTACKS = ("router", "data", "zmtp", "flood")
TARGETS = ("plain", "curve")
MAX_REQUEST_SAMPLES = 512
CLIENT_TTL_S = 3.0  # sessions of fuzz connections closed without BYE are freed soon
BATCH_SIZE = 16
DEMO = DemoSpec(fmt="arrow", shards=6, samples_per_shard=100, image_shape=(3, 8, 8))
PROGRESS_S = 30.0
SETTLE_S = 30.0
JOIN_S = 120.0
STATS_KEYS = ("malformed", "refused", "sessions_refused", "auth_refused", "connections_cut",
              "clients_expired", "sessions_idle_expired", "clients_probed", "dropped_sends",
              "log_lines_suppressed", "worker_restarts", "requests", "replies")
MiB = 2**20
CAPS = {"--max-inbound-total": str(8 * MiB), "--max-window-samples": "8192",
        "--max-reply-bytes": str(MiB), "--max-unsent-bytes": str(16 * MiB)}
"""Caps tighter than the defaults (the fuzz's batches are a few KB), for a tight memory bound."""


@dataclass(frozen=True)
class FuzzConfig:
    """Settings of one fuzz run, validated on construction.

    Attributes:
        minutes: attack time, shared by the targets (each server's start is not counted).
        seed: seed of every attack's first round.
        seeds: most rounds per attack and target (0: as many as the time allows); every
            attack runs at least one round whatever the time.
        attacks: which attacks run (of :data:`ATTACKS`).
        targets: which servers are fuzzed (of :data:`TARGETS`).
        workers: reader processes of each server.
        flood_hold: most seconds a flood keeps its connections open and silent (beyond the
            server's 10 s ZMTP heartbeat timeout by default).
        answer_timeout: seconds a reader, and the DataLoader, may take for one answer.
        rss_slack_mib: allowance of each server process over the memory bound of its flags
            (Python's heap, the allocator's pools).
    """

    minutes: float = 5.0
    seed: int = 0
    seeds: int = 0
    attacks: tuple[str, ...] = ATTACKS
    targets: tuple[str, ...] = TARGETS
    workers: int = 2
    flood_hold: float = 15.0
    answer_timeout: float = 30.0
    rss_slack_mib: float = 64.0

    def __post_init__(self) -> None:
        if not self.minutes > 0:
            raise ConfigError(f"`minutes` must be > 0. Found: {self.minutes}")
        for name, lo in (("seed", 0), ("seeds", 0), ("workers", 1)):
            object.__setattr__(self, name, check_int(name, getattr(self, name), lo))
        for name, got, known in (("attacks", self.attacks, ATTACKS),
                                 ("targets", self.targets, TARGETS)):
            if not got or not set(got) <= set(known):
                raise ConfigError(f"`{name}` must be some of {','.join(known)}. "
                                  f"Found: {','.join(got)}")
        if self.flood_hold < 0 or not self.answer_timeout > 0 or not self.rss_slack_mib > 0:
            raise ConfigError("`flood_hold` must be >= 0, `answer_timeout` and "
                              f"`rss_slack_mib` > 0. Found: {self.flood_hold}, "
                              f"{self.answer_timeout}, {self.rss_slack_mib}")


@dataclass
class TargetReport:
    """What one target's fuzz did and found."""

    name: str
    endpoint: str = ""
    seconds: float = 0.0
    rounds: dict[str, int] = field(default_factory=dict)
    epochs: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    rss: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    exit_code: int | None = None
    tally: Tally = field(default_factory=Tally)


def _ask(endpoint: str, curve: ClientCurve | None, timeout: float) -> tuple[wire.Index, dict]:
    """A fresh session's INDEX and STATS; the session is closed (BYE) after.

    Raises:
        TimeoutError: no answer within ``timeout`` seconds.
        zmq.Again: no message taken within ``timeout`` seconds.
    """
    sock: zmq.Socket = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDTIMEO, int(timeout * 1000))
    secure_client(sock, curve)
    sock.connect(endpoint)
    try:
        replies = []
        for msg in (wire.Hello(1, "fuzz probe"), wire.Stats()):
            sock.send_multipart(wire.encode(msg))
            if not sock.poll(int(timeout * 1000)):
                raise TimeoutError(f"{endpoint}: no answer to {wire.kind_of(msg).name} "
                                   f"within {timeout} s")
            replies.append(wire.decode(sock.recv_multipart()))
        sock.send_multipart(wire.encode(wire.Bye()))
    finally:
        sock.close(linger=1000)
    index, stats = replies
    if not isinstance(index, wire.Index) or not isinstance(stats, wire.StatsReply):
        raise TimeoutError(f"{endpoint}: answered HELLO, STATS with {replies}")
    return index, {k: v for k, v in stats.counters.items() if isinstance(v, int)}


def _flags() -> list[str]:
    """The server flags of every target but its keys."""
    return ["--max-request-samples", str(MAX_REQUEST_SAMPLES), "--client-ttl",
            str(CLIENT_TTL_S), *(x for cap in CAPS.items() for x in cap)]


def bound_of(cfg: FuzzConfig) -> MemoryBound:
    """The memory bound of the fuzzed servers' flags (:func:`memory_bound`)."""
    return memory_bound(parse_args(["--data", "fuzz", "--workers", str(cfg.workers),
                                    *_flags()]))


def _start(name: str, data: list[str], tmp: Path, cfg: FuzzConfig
           ) -> tuple[ServerHandle, ClientCurve | None]:
    extra = _flags()
    curve = None
    if name == "curve":
        server_public, server_secret = generate_keys(str(tmp / "server"), "server")
        _, secret = generate_keys(str(tmp / "allowed"), "fuzzer")
        secret = secret.rename(tmp / secret.name)
        extra += ["--curve-secret-key", str(server_secret),
                  "--curve-allowed-keys", str(tmp / "allowed")]
        curve = ClientCurve(str(secret), str(server_public))
    return launch(data, workers=cfg.workers, extra_args=extra, timeout=120), curve


ROUNDS: dict[str, Callable[[Round], None]] = {
    "router": router_round, "data": data_round, "zmtp": zmtp_round, "flood": flood_round}


def _attacker(name: str, target: Target, cfg: FuzzConfig, index: int, report: TargetReport,
              stop: threading.Event) -> None:
    """Rounds of attack ``name`` until ``stop`` (at least one) or ``cfg.seeds`` rounds."""
    done = 0
    while not (stop.is_set() and done) and not (cfg.seeds and done >= cfg.seeds):
        seed = cfg.seed + done
        rng = np.random.default_rng([seed, ATTACKS.index(name), index])
        try:
            ROUNDS[name](Round(target, rng, report.tally, stop, seed, cfg.flood_hold))
        except Exception as e:  # the fuzzer's own failure: reported, never hidden
            report.tally.violation(f"{name} (seed {seed}): the round raised "
                                   f"{type(e).__name__}: {e}")
            break
        done += 1
        report.rounds[name] = done


def _legit(target: Target, total: int, cfg: FuzzConfig, report: TargetReport,
           stop: threading.Event) -> None:
    """Epochs of a real DataLoader until ``stop``, each checked for every sample once."""
    from dataflow.client import DataLoader

    curve = target.curve
    try:
        with DataLoader(target.endpoint, batch_size=BATCH_SIZE, rank=0, world_size=1,
                        timeout=cfg.answer_timeout,
                        curve_key=curve.secret_key_file if curve else None,
                        server_key=curve.server_key_file if curve else None) as dl:
            while not stop.is_set():
                ids = np.sort(np.concatenate([b["id"].numpy() for b in dl]))
                if not np.array_equal(ids, np.arange(total)):
                    report.tally.violation(
                        f"legit: epoch {report.epochs} held {len(ids)} samples, "
                        f"{len(np.unique(ids))} distinct, of {total}")
                    return
                report.epochs += 1
    except Exception as e:
        report.tally.violation(f"legit: the DataLoader failed in epoch {report.epochs}: "
                               f"{type(e).__name__}: {e}")


def _progress(out: TextIO, report: TargetReport, elapsed: float, budget: float,
              pids: list[int]) -> None:
    sent = {a: sum(n for (attack, _), n in report.tally.sent.items() if attack == a)
            for a in ATTACKS}
    rss = max((peak_rss_bytes(p) or 0) for p in pids) / MiB
    print(f"[{report.name} {elapsed:.0f}/{budget:.0f} s] sent {sent}; {report.epochs} epochs; "
          f"largest peak RSS {rss:.0f} MiB", file=out, flush=True)


def _fuzz_target(name: str, index: int, data: list[str], total: int, budget: float,
                 tmp: Path, cfg: FuzzConfig, out: TextIO) -> TargetReport:
    report = TargetReport(name)
    handle, curve = _start(name, data, tmp / name, cfg)
    tally = report.tally
    died = False
    try:
        report.endpoint = handle.endpoint
        index_msg, _ = _ask(handle.endpoint, curve, cfg.answer_timeout)
        fields = tuple(f.name for f in DatasetIndex.from_json(index_msg.index_json).schema)
        target = Target(handle.endpoint, tuple(handle.ready["data_endpoints"]), fields,
                        MAX_REQUEST_SAMPLES, curve, cfg.answer_timeout)
        roles = {handle.pid: "frontend", **{pid: f"reader {i}" for i, pid in
                                            enumerate(handle.ready["worker_pids"])}}
        start_rss = {pid: peak_rss_bytes(pid) or 0 for pid in roles}
        stop = threading.Event()
        # Daemons: one stuck is reported (below), and never keeps the process from exiting.
        threads = [threading.Thread(target=_attacker, args=(a, target, cfg, index, report, stop),
                                    name=f"fuzz-{a}", daemon=True) for a in cfg.attacks]
        threads.append(threading.Thread(target=_legit, args=(target, total, cfg, report, stop),
                                        name="fuzz-legit", daemon=True))
        start = time.monotonic()
        for t in threads:
            t.start()
        last = start
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            dead = [roles[pid] for pid in roles if not alive(pid)]
            died = bool(dead)
            if dead:
                tally.violation(f"server died: {', '.join(dead)} gone after {now - start:.0f} "
                                f"s; its stderr ends with:\n{handle.stderr_tail(2000)}")
                break
            done = [report.rounds.get(a, 0) for a in cfg.attacks]
            if (now - start >= budget and min(done) >= 1
                    or cfg.seeds and min(done) >= cfg.seeds):
                break
            if now - last >= PROGRESS_S:
                _progress(out, report, now - start, budget, list(roles))
                last = now
        stop.set()
        for t in threads:
            t.join(JOIN_S)
            if t.is_alive():
                tally.violation(f"{t.name} did not stop within {JOIN_S} s of the end")
        report.seconds = time.monotonic() - start
        report.rss = {roles[pid]: (start_rss[pid], peak_rss_bytes(pid)) for pid in roles}
        if all(alive(pid) for pid in roles):
            try:
                _final_checks(handle.endpoint, curve, cfg, report)
            except (TimeoutError, zmq.Again) as e:
                tally.violation(f"the server did not answer after the fuzz: {e!r}")
    finally:
        report.exit_code = handle.close()
    if report.exit_code != 0 and not died:
        tally.violation(f"server exit code {report.exit_code} on SIGTERM (0 expected); its "
                        f"stderr ends with:\n{handle.stderr_tail(2000)}")
    return report


def _final_checks(endpoint: str, curve: ClientCurve | None, cfg: FuzzConfig,
                  report: TargetReport) -> None:
    tally = report.tally
    deadline = time.monotonic() + SETTLE_S
    while True:  # the last rounds' messages may still be on their way
        _, stats = _ask(endpoint, curve, cfg.answer_timeout)
        if stats["malformed"] >= tally.malformed_min or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    report.stats = {k: stats.get(k, 0) for k in STATS_KEYS}
    low, high = tally.malformed_min, tally.malformed_min + tally.malformed_extra
    if not low <= stats["malformed"] <= high:
        tally.violation(f"STATS malformed {stats['malformed']}, predicted {low}..{high}")
    if stats["worker_restarts"]:
        tally.violation(f"{stats['worker_restarts']} reader restart(s)")
    bound, slack = bound_of(cfg), cfg.rss_slack_mib * MiB
    growth = {role: peak - before for role, (before, peak) in report.rss.items()
              if peak is not None}
    readers = sum(g for role, g in growth.items() if role != "frontend")
    limits = (("frontend", growth.get("frontend", 0), bound.frontend + slack),
              ("readers", readers, bound.readers + cfg.workers * slack))
    for role, grew, limit in limits:
        if grew > limit:
            tally.violation(f"{role}: peak RSS grew {grew / MiB:.0f} MiB (bound "
                            f"{limit / MiB:.0f} MiB: the formula of the server's flags and "
                            f"{cfg.rss_slack_mib:.0f} MiB a process)")
    if report.epochs == 0:
        tally.violation("legit: no epoch completed")


def format_report(report: TargetReport, cfg: FuzzConfig) -> str:
    """One target's report, as printed."""
    rounds = ", ".join(f"{a} {n} (seeds {cfg.seed}..{cfg.seed + n - 1})"
                       for a, n in report.rounds.items())
    lines = [f"== {report.name}: {report.endpoint}, {cfg.workers} readers, "
             f"{report.seconds:.0f} s; rounds: {rounds}", "sent:"]
    for (attack, label), n in sorted(report.tally.sent.items()):
        lines.append(f"  {attack:<7} {label:<28} {n:>10}")
    lines.append(f"legit DataLoader: {report.epochs} epoch(s) read, every sample once in each")
    if report.stats:
        lines.append("STATS: " + ", ".join(f"{k} {v}" for k, v in report.stats.items()))
        lines.append(f"  malformed predicted {report.tally.malformed_min}.."
                     f"{report.tally.malformed_min + report.tally.malformed_extra}")
    lines.append("peak RSS (MiB): " + ", ".join(
        f"{role} gone" if peak is None
        else f"{role} {peak / MiB:.0f} (+{(peak - before) / MiB:.0f})"
        for role, (before, peak) in report.rss.items()))
    bound = bound_of(cfg)
    lines.append(f"  bound of the flags (MiB): frontend +{bound.frontend / MiB:.0f}, readers "
                 f"together +{bound.readers / MiB:.0f}, {cfg.rss_slack_mib:.0f} more a process")
    lines.append(f"server exit code on SIGTERM: {report.exit_code}")
    lines += [f"VIOLATION: {v}" for v in report.tally.violations] or ["violations: none"]
    if any(v.startswith("server died") for v in report.tally.violations):
        lines.append("(a server process died: the violations of the other attacks and of the "
                     "DataLoader around that moment follow from its death)")
    return "\n".join(lines)


def run_fuzz(cfg: FuzzConfig, out: TextIO = sys.stdout) -> bool:
    """Fuzz every target of ``cfg`` in turn, print the reports; whether no violation."""
    budget = cfg.minutes * 60 / len(cfg.targets)
    reports = []
    with tempfile.TemporaryDirectory(prefix="dataflow-fuzz-") as tmp:
        demo = make_demo(str(Path(tmp) / "data"), DEMO, progress=None)
        data = [str(p) for p in demo.paths]
        for i, name in enumerate(cfg.targets):
            print(f"fuzzing the {name} server for {budget:.0f} s ...", file=out, flush=True)
            report = _fuzz_target(name, i, data, demo.total, budget, Path(tmp), cfg, out)
            print(format_report(report, cfg), file=out, flush=True)
            reports.append(report)
    bad = sum(len(r.tally.violations) for r in reports)
    print(f"fuzz: {'PASS' if not bad else 'FAIL'} ({bad} violation(s))", file=out, flush=True)
    return not bad
