"""Trainer-side client of the dataflow loader servers: a drop-in :class:`DataLoader`."""

from client.config import LoaderConfig
from client.loader import DataLoader

__all__ = ["DataLoader", "LoaderConfig"]
