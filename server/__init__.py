"""The loader server: ``python -m dataflow.server`` / ``dataflow-server``, and ``launch()``.

This package never imports torch.
"""

from dataflow.server.config import ServerConfig
from dataflow.server.launch import ServerHandle, launch

__all__ = ["ServerConfig", "ServerHandle", "launch"]
