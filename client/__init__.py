"""Trainer-side client of the dataflow loader servers: a drop-in :class:`DataLoader`."""

from dataflow.client.config import LoaderConfig
from dataflow.client.loader import DataLoader

__all__ = ["DataLoader", "LoaderConfig"]
