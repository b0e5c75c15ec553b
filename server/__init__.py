"""The dataflow loader server: ``python -m server`` / ``dataflow-server``, and ``launch()``.

This package never imports torch.
"""

from server.config import ServerConfig
from server.launch import ServerHandle, launch

__all__ = ["ServerConfig", "ServerHandle", "launch"]
