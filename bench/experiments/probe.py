"""What one health probe costs: ``dataflow-server health`` (over HTTP and over the wire
protocol) beside a probe of ``/healthz`` with Python's standard library alone and with curl.

A server on a small demo dataset with ``--metrics-port``; each probe command runs
``--probes`` times in a fresh process (as Docker's ``HEALTHCHECK`` and exec probes run it);
the median wall time and the CPU time of the probe process are reported. Kubernetes asks
``/healthz`` itself (``httpGet``): no process at all.

    python -m dataflow.bench.experiments.probe --probes 7
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import DataflowError
from dataflow.server import launch

STDLIB_PROBE = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of one probe process; it must exit 0."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    assert proc.stderr is not None
    said = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise DataflowError(f"{cmd[:3]} exited {proc.returncode}: {said[-300:]}")
    return wall, usage.ru_utime + usage.ru_stime


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.bench.experiments.probe",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", type=int, default=7,
                   help="probes per command (default: %(default)s)")
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="probe-")
    bindir = os.path.dirname(sys.executable)
    port = _free_port()
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        make_demo(work, DemoSpec(fmt="tar", shards=2, samples_per_shard=64, uneven=False,
                                 image_shape=(3, 8, 8)), progress=None)
        with launch([work], workers=1, extra_args=["--metrics-port", str(port),
                                                   "--cache-dir", os.path.join(work, "c")]) as s:
            cmds = {
                "dataflow-server health --http URL": [
                    os.path.join(bindir, "dataflow-server"), "health", "--http", url],
                "dataflow-server health --endpoint ENDPOINT": [
                    os.path.join(bindir, "dataflow-server"), "health", "--endpoint", s.endpoint],
                "python -c (urllib, standard library only)": [sys.executable, "-c",
                                                              STDLIB_PROBE, url],
            }
            curl = shutil.which("curl")
            if curl:
                cmds["curl -fsS URL"] = [curl, "-fsS", "-o", os.devnull, url]
            print("| probe | wall s (median) | CPU s (median) |\n| --- | --- | --- |")
            deadline = time.monotonic() + 30
            while True:  # /healthz answers 200 once the first snapshot is in
                try:
                    _run(cmds["python -c (urllib, standard library only)"])
                    break
                except DataflowError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            for name, cmd in cmds.items():
                runs = [_run(cmd) for _ in range(args.probes)]
                print(f"| {name} | {statistics.median(r[0] for r in runs):.3f} | "
                      f"{statistics.median(r[1] for r in runs):.3f} |", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
