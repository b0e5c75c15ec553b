"""Trainer-side client of the dataflow loader servers: a drop-in :class:`DataLoader`."""

from dataflow.client.config import LoaderConfig
from dataflow.client.decode import Decode, ImageDecode
from dataflow.client.loader import DataLoader

__all__ = ["DataLoader", "Decode", "ImageDecode", "LoaderConfig"]
