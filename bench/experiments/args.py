"""Command-line argument types shared by the experiments."""

from __future__ import annotations

import argparse


def per_request(text: str) -> int | str:
    """A DataLoader's ``batches_per_request`` on a command line: ``auto`` or an integer."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"auto or an integer, not {text!r}") from None
