"""How well an epoch order mixes: pure measures over batches of sample ids (numpy only).

Each batch is an int array of sample ids; ``labels[id]`` is a sample's class.
"""

from __future__ import annotations

import numpy as np


def distinct_classes(batches: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean number of distinct classes per batch."""
    return float(np.mean([len(np.unique(labels[b])) for b in batches]))


def kept_pairs(first: list[np.ndarray], second: list[np.ndarray], total: int) -> float:
    """Share of the pairs co-batched in ``first`` that are co-batched again in ``second``
    (ids below ``total``; a full shuffle gives about ``batch / total``)."""
    where = np.full(total, -1)
    for i, b in enumerate(second):
        where[b] = i
    kept = pairs = 0
    for b in first:
        counts = np.bincount(where[b][where[b] >= 0])
        kept += int((counts * (counts - 1) // 2).sum())
        pairs += len(b) * (len(b) - 1) // 2
    return kept / pairs


def ks_to_uniform(batches: list[np.ndarray], labels: np.ndarray) -> float:
    """Mean over classes of the Kolmogorov-Smirnov distance between the class's positions in
    the epoch (normalised to [0, 1]) and the uniform distribution."""
    ids = np.concatenate(batches)
    positions = (np.arange(len(ids)) + 0.5) / len(ids)
    distances = []
    for c in np.unique(labels[ids]):
        x = np.sort(positions[labels[ids] == c])
        n = len(x)
        steps = np.arange(1, n + 1) / n
        distances.append(max((steps - x).max(), (x - (steps - 1 / n)).max()))
    return float(np.mean(distances))
