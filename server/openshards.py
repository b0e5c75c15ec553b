"""How many shards each reader process keeps open (``--max-open-shards``), decided once the
dataset is indexed.

A batch of the default (sample-level) shuffle reads from nearly as many shards as it has
samples, so a reader that cannot keep every shard open reopens some for every batch (a tar's
member index loaded again, an Arrow file mapped again: 0.3-0.9 ms each). On 4,096 shards with
1,024 open the default shuffle read at 0.06-0.07x the samples/s of ``shuffle="none"``, with
every shard open at 0.58-0.65x (bench/RESULTS.md, "The default shuffle on 4,096 shards").
``auto``, the default, therefore keeps every shard open, as far as the open-file hard limit
and :data:`AUTO_CAP` allow; a number keeps that many, the least recently used closed first.

What an open shard costs a reader: two file descriptors (:data:`SHARD_DESCRIPTORS`) and a
memory map, and for a tar its
member index (:func:`member_index_bytes`): the server's memory bound counts it with each
reader's size (docs/architecture.md, Memory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dataflow.errors import ServerStartError

AUTO_CAP = 16384
"""The most shards ``auto`` keeps open in a reader: each is a memory map, and Linux allows a
process 65,530 by default (``vm.max_map_count``), which the reader's libraries, heap and
shared-memory slots share."""
OWN_DESCRIPTORS = 256
"""Descriptors a server process needs besides its client connections, sessions' segments and
open shards (also those of shards closed while a reply not yet sent still views their
maps)."""
SEGMENT_DESCRIPTORS = 2
"""Descriptors a reader holds for a session's shared-memory segment (its own and its map's)."""
SHARD_DESCRIPTORS = 2
"""Descriptors an open shard holds: its guard's (:class:`~dataflow.readers.guard.FileGuard`)
and its memory map's own (Python's ``mmap`` and Arrow's each keep a descriptor of the file they
map)."""
INDEX_DESCRIPTORS = 2
"""Descriptors a tar shard's member index holds when mapped to be shared by the host's readers
(:mod:`~dataflow.readers.tar.sharedindex`: the index file's guard and its map's). Optional:
where the hard limit leaves no room, indexes are read into each reader."""
INDEX_BYTES_PER_FIELD = 24
INDEX_BYTES_PER_SAMPLE = 16
"""A tar's member index in memory: for every sample 8 bytes for each field's offset, size
and integer value (:class:`~dataflow.readers.tar.TarIndex`), 8 for its first header's
offset, and 8 for its key's offset where ``__key__`` is served, besides the key's
characters."""


@dataclass(frozen=True)
class OpenShards:
    """What a server's readers keep open.

    Attributes:
        count: shards each reader keeps open.
        descriptors: the open-file limit each server process needs for them and the rest
            (``others``).
        shared_indexes: tar member indexes each reader may map shared besides
            (:data:`INDEX_DESCRIPTORS` each: ``count`` where the hard limit leaves room).
        advice: what to tell the operator when a batch of the default shuffle will reopen
            shards (fewer open than the dataset has), else None.
    """

    count: int
    descriptors: int
    shared_indexes: int
    advice: str | None

    @property
    def reserve(self) -> int:
        """The open-file limit to set: :attr:`descriptors` and the shared indexes'."""
        return self.descriptors + INDEX_DESCRIPTORS * self.shared_indexes


def open_shards(setting: int | None, shards: int, others: int,
                hard_limit: int | None) -> OpenShards:
    """Each reader's open shards for ``--max-open-shards`` ``setting`` (None: ``auto``).

    Args:
        setting: the flag's number, or None for ``auto``: every shard, at most
            :data:`AUTO_CAP` and what the open-file hard limit leaves.
        shards: the dataset's shards.
        others: descriptors a server process needs besides its shards
            (:attr:`~dataflow.server.config.ServerConfig.descriptors` with no shard given).
        hard_limit: the open-file hard limit (``ulimit -Hn``); None: unlimited.

    Raises:
        ServerStartError: the hard limit does not allow ``setting`` shards (or, for
            ``auto``, one) besides ``others``.
    """
    if setting is not None:
        count = setting
    else:
        room = AUTO_CAP if hard_limit is None else (hard_limit - others) // SHARD_DESCRIPTORS
        count = min(max(shards, 1), AUTO_CAP, room)
    needed = others + SHARD_DESCRIPTORS * max(count, 1)
    if count < 1 or (hard_limit is not None and needed > hard_limit):
        raise ServerStartError(f"--max-sessions and --max-open-shards need {needed} file "
                               f"descriptors per process; the hard limit (ulimit -Hn) is "
                               f"{hard_limit}")
    spare = count if hard_limit is None else (hard_limit - needed) // INDEX_DESCRIPTORS
    return OpenShards(count, needed, min(count, spare), _advice(setting, shards, count,
                                                                 hard_limit))


def _advice(setting: int | None, shards: int, count: int, hard_limit: int | None) -> str | None:
    if shards <= count:
        return None
    cost = ("a batch of the default shuffle reads from hundreds of shards, so readers reopen "
            "shards for every batch (measured on 4,096 shards: 0.06-0.07x the samples/s of "
            "shuffle='none' with 1,024 open, 0.58-0.65x with all open)")
    if setting is not None:
        return (f"the dataset has {shards} shards and each reader keeps --max-open-shards "
                f"{setting} open: {cost}; give --max-open-shards {shards} (or auto) "
                "if memory allows (two descriptors and a map a shard, and for a tar its member "
                "index, ~110 bytes a sample, in each reader)")
    why = (f"--max-open-shards auto keeps at most {AUTO_CAP}" if count == AUTO_CAP
           else f"the open-file hard limit (ulimit -Hn) {hard_limit} leaves room for {count}")
    return (f"the dataset has {shards} shards and each reader keeps {count} open ({why}): "
            f"{cost}; raise the hard limit (e.g. LimitNOFILE, --ulimit nofile) and give "
            f"--max-open-shards {shards}")


def member_index_bytes(sizes: Sequence[int], fields: int, count: int) -> int:
    """Bytes of the tar member indexes of the ``count`` largest of shards of ``sizes``
    samples and ``fields`` fields, keys' characters aside: what a reader keeping them open
    holds for them (:data:`INDEX_BYTES_PER_SAMPLE`)."""
    largest = sorted(sizes, reverse=True)[:count]
    return sum(largest) * (INDEX_BYTES_PER_FIELD * fields + INDEX_BYTES_PER_SAMPLE)
