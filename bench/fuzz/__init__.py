"""The long fuzz of real servers (``python -m dataflow.bench fuzz``), outside the test suite:
:mod:`.run` the run and its checks, :mod:`.attacks` the attacks, :mod:`.gen` mutated wire
messages and the oracle that predicts the server's answers, :mod:`.zmtp` raw ZMTP."""

from dataflow.bench.fuzz.run import ATTACKS, TARGETS, FuzzConfig, run_fuzz

__all__ = ["ATTACKS", "TARGETS", "FuzzConfig", "run_fuzz"]
