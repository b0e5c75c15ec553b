"""Trainer-side client of the dataflow loader servers: a drop-in :class:`DataLoader`."""

from dataflow.client.config import LoaderConfig
from dataflow.client.decode import Decode, ImageDecode
from dataflow.client.lineage import Origin
from dataflow.client.loader import DataLoader
from dataflow.client.mixture import MixtureConfig, MixtureLoader, Source

__all__ = ["DataLoader", "Decode", "ImageDecode", "LoaderConfig", "MixtureConfig",
           "MixtureLoader", "Origin", "Source"]
