"""dataflow's bench: GPU-idle time of a training loop fed by dataflow, torch's DataLoader and peers.

Run ``python -m dataflow.bench demo`` first; ``python -m dataflow.bench --help`` lists the
modes. This package file stays light (no torch import) so the component benchmarks in
:mod:`dataflow.bench.experiments` start fast; the measured loop is
:func:`dataflow.bench.loop.measure`.
"""

from dataflow.bench.config import BenchConfig

__all__ = ["BenchConfig"]
