"""Room in the trainer process's open-file limit for a server's connections.

Every connection of a loader (a server's control link, one a reader) costs the trainer
process about four descriptors (the TCP socket, the ZeroMQ socket's and its monitor's
mailboxes): a loader joined to 16 servers of 16 readers holds over 1,000, past the soft limit
most Linux systems start processes with (1,024), where ZeroMQ fails with "Too many open
files". Before it opens a connection, a loader raises the soft limit as far as it needs
(never past the hard limit), or fails at once naming the limit.
"""

from __future__ import annotations

import os
import resource

from dataflow.errors import ConfigError

LINK_DESCRIPTORS = 6
"""Descriptors counted for one connection (about 4.3 measured a reader connection), with room."""
SPARE_DESCRIPTORS = 64
"""Descriptors left free besides those of the connections about to open."""


def soft_limit_for(open_now: int, links: int, soft: int | None, hard: int | None) -> int | None:
    """The soft open-file limit to set before opening ``links`` connections with ``open_now``
    descriptors open; None: ``soft`` is enough. None for a limit means unlimited.

    Raises:
        ConfigError: the hard limit is too low, naming both limits.
    """
    needed = open_now + LINK_DESCRIPTORS * links + SPARE_DESCRIPTORS
    if soft is None or needed <= soft:
        return None
    if hard is not None and needed > hard:
        raise ConfigError(f"this process has {open_now} file descriptors open and its next "
                          f"{links} server connections need about {needed - open_now} more, "
                          f"past the open-file hard limit (ulimit -Hn) {hard}; raise it "
                          "(LimitNOFILE in systemd, --ulimit nofile in a container) or use "
                          "fewer servers or reader processes")
    return needed


def reserve(links: int) -> None:
    """Raise this process's soft open-file limit so that ``links`` more connections fit
    (:func:`soft_limit_for`); a no-op where ``/proc/self/fd`` cannot be listed.

    Raises:
        ConfigError: the hard limit is too low.
    """
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    infinite = resource.RLIM_INFINITY
    new = soft_limit_for(open_now, links, None if soft == infinite else soft,
                         None if hard == infinite else hard)
    if new is not None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
