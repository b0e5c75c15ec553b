"""dataflow's bench: GPU-idle time of a training loop fed by dataflow, torch's DataLoader and peers.

Run ``python -m bench demo`` first; ``python -m bench --help`` lists the modes. This package
file stays light (no torch import) so the other benchmarks in ``bench/`` start fast; the
measured loop is :func:`bench.loop.measure`.
"""

from bench.config import BenchConfig

__all__ = ["BenchConfig"]
