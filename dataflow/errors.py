"""The project's one error hierarchy: every exception class dataflow raises lives here.

Every message names the shard, endpoint or field involved, so a user can act on it
without a debugger.

A few classes are signals between dataflow's own modules, always caught before they reach a
caller of the public API: :class:`FieldError` (turned into a :class:`ProtocolError` or a
:class:`ConfigError` naming the field), :class:`RemoteFailure` and :class:`RangeUnsupported`
(into a :class:`ShardReadError` or :class:`SpecError` naming the URL), :class:`IndexCacheError`
and :class:`OutdatedIndex` (a cached index is rebuilt) and :class:`ReplyTooLarge` (an ERROR
reply a client raises as :class:`RemoteError`).

:class:`ErrorKind` names what failed in an ERROR message of the wire (and
:attr:`RemoteError.kind`); the wire re-exports it. This module imports nothing of dataflow, so
every module may import it.
"""

from __future__ import annotations

from enum import Enum


class ErrorKind(str, Enum):
    """What failed, the ``kind`` of an ERROR message (str-valued: ``kind == "UnknownClient"``).

    Attributes:
        PROTOCOL: the peer sent a malformed or refused message (also: over credits, duplicate
            request id, invalid ranges).
        UNKNOWN_CLIENT: no session for this client (never opened, freed, or server restarted).
        WORKER_DIED: the reader process holding the request exited.
        WORKER_UNAVAILABLE: no reader could take the request.
        UNDELIVERABLE: the reply could not be handed to the client's data connection.
        READ_FAILED: reading or transforming the data failed (a damaged or changed shard, an
            I/O error, the transform, a batch over ``--max-reply-bytes``); the message starts
            with the server-side exception class name (``"ShardReadError: ..."``).
        INTERNAL: serving the request met a bug of the server (an impossible state, or an
            exception nobody foresaw); the message starts with the exception class name
            (``"KeyError: ..."``) and the server logged its traceback. Added after protocol
            version 1 shipped: a client that predates it refuses such an ERROR as malformed
            (naming the field and the value).
        SERVER_STOPPING: the server is shutting down (SIGTERM/SIGINT); sent once to every
            session with ``req_id == -1`` before it closes. Outstanding requests will not be
            answered: send them to another server now.
        SERVER_BUSY: HELLO refused: the server already holds ``--max-sessions`` sessions
            (``req_id == -1``); try another server or later.
    """

    PROTOCOL = "ProtocolError"
    UNKNOWN_CLIENT = "UnknownClient"
    WORKER_DIED = "WorkerDied"
    WORKER_UNAVAILABLE = "WorkerUnavailable"
    UNDELIVERABLE = "Undeliverable"
    READ_FAILED = "ReadFailed"
    INTERNAL = "InternalError"
    SERVER_STOPPING = "ServerStopping"
    SERVER_BUSY = "ServerBusy"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class DataflowError(Exception):
    """Base of every error raised by dataflow."""


class ConfigError(DataflowError, ValueError):
    """A configuration value is invalid (raised on construction)."""


class SpecError(DataflowError):
    """A dataset spec is malformed or matches no shard."""


class ShardReadError(DataflowError):
    """A shard could not be read.

    Attributes:
        shard: URL or path of the shard.
        offset: byte offset of the problem, when known.
        index: sample index inside the shard, when known.
    """

    def __init__(
        self, shard: str, message: str, *, offset: int | None = None, index: int | None = None
    ) -> None:
        where = []
        if index is not None:
            where.append(f"sample {index}")
        if offset is not None:
            where.append(f"byte offset {offset}")
        loc = f" ({', '.join(where)})" if where else ""
        super().__init__(f"{shard}{loc}: {message}")
        self.shard = shard
        self.offset = offset
        self.index = index


class ShardChangedError(ShardReadError):
    """A shard is not the file its dataset index was built from (rewritten, replaced, cut
    short): nothing of it is served, since its samples no longer match the index."""


class SchemaError(DataflowError):
    """Data cannot be served as the options ask: a type with no served form, nulls with
    neither a fill value nor a mask, lists off the shape their type declares, two fields
    served under one name, a column asked for that no field has, shards under different hive
    partitions. The message names the field and the flag that fixes it; a reader raises it as
    the cause of a :class:`ShardReadError` naming the shard."""


class SchemaMismatchError(SchemaError):
    """Two shards of one dataset disagree on their schema (or two sources of a mixture, whose
    batches hold the fields they share, on their fields)."""

    def __init__(self, shard_a: str, shard_b: str, field: str, detail: str) -> None:
        super().__init__(
            f"schema mismatch on field {field!r} between {shard_a} and {shard_b}: {detail}"
        )
        self.shard_a = shard_a
        self.shard_b = shard_b
        self.field = field


class IndexCacheError(DataflowError):
    """A cached index (a tar shard's member index, the dataset index cache) is unreadable,
    truncated, modified after it was saved, or of other shards or options: it is rebuilt,
    never used. Internal: the message names the file and says why."""


class OutdatedIndex(IndexCacheError):
    """A cached index of another format version: rebuilt quietly (no harm done)."""


class RemoteFailure(DataflowError):
    """A remote request failed for good (after the remote layer's retries).

    Internal: raised as a :class:`ShardReadError` or :class:`SpecError` naming the URL.

    Attributes:
        url: what was asked for.
        reason: the one-line description (endpoint, bucket, likely fix), without the URL.
    """

    def __init__(self, url: str, message: str) -> None:
        super().__init__(f"{url}: {message}")
        self.url = url
        self.reason = message


class RangeUnsupported(DataflowError):
    """An HTTP server answered a ranged GET with the whole file (it ignores ``Range``).

    Internal: the remote reader then fetches the whole file once into its cache."""


class ProtocolError(DataflowError):
    """A wire message is malformed, truncated, oversized or of another protocol version."""


class FieldError(DataflowError):
    """Why a value is invalid for a wire field, without the field's name. Internal: the
    codec raises it as a :class:`ProtocolError` naming the message kind, the field and the
    value; a client's configuration as a :class:`ConfigError` naming the argument."""


class ReplyTooLarge(DataflowError):
    """A batch exceeds the server's ``--max-reply-bytes``. Internal to the server: the
    client gets an ERROR of kind ``ReadFailed`` ("ReplyTooLarge: ...")."""


class SegmentError(DataflowError):
    """A shared-memory segment cannot be created, or one a peer named cannot be opened or
    used (:mod:`dataflow.shm`; the message names the file and why). Internal: the session,
    or the one batch, then travels in TCP frames."""


class ServerStartError(DataflowError):
    """A loader server (or one of its reader processes) could not start."""


class MetricsError(DataflowError):
    """A Prometheus metrics endpoint could not start (its port is taken) or its metrics could
    not be registered (the registry has them already)."""


class StateMismatchError(DataflowError):
    """A ``state_dict`` does not fit this loader (another configuration, a bad field)."""


class DatasetMismatchError(DataflowError):
    """A server serves another dataset than the loader's, or a state was saved on another
    dataset."""


class LoaderClosedError(DataflowError):
    """The DataLoader was closed (or failed) and cannot be used any more."""


class StaleIteratorError(DataflowError):
    """An iterator was used after a newer one started (or after set_epoch/load_state_dict)."""


class InternalError(DataflowError):
    """An impossible state was reached: a bug in dataflow, never a condition to handle."""


class TransformError(DataflowError):
    """A server-side transform failed or returned something other than a batch; the message
    names the transform and the batch (epoch, global batch index, shard ranges)."""


class DecodeError(DataflowError):
    """A field the DataLoader's ``decode`` names could not be decoded on the trainer: missing
    from a batch, not a bytes field, or a sample that is not a decodable image (or smaller
    than the crop). Nothing is skipped: the batch fails where the loop reaches it.

    Attributes:
        field: the field.
        position: the sample's position in the batch, or None when the whole field is wrong.
        shard: the sample's shard (relative to the dataset root), when the batch says it.
        sample: the sample's index in that shard, when known.
    """

    def __init__(self, message: str, *, field: str, position: int | None = None,
                 shard: str | None = None, sample: int | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.position = position
        self.shard = shard
        self.sample = sample


class ServerUnavailable(DataflowError):
    """A loader server did not answer within the timeout."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"{endpoint}: {message}")
        self.endpoint = endpoint


class RequestTimeout(ServerUnavailable):
    """No server answered a request within the DataLoader's ``request_timeout``, and no other
    server could be asked; the message names the servers asked, the batch and their
    ``--transform``.

    Attributes:
        endpoint: the servers asked, comma-separated.
        epoch: the batch's epoch.
        batch: its global batch index in the epoch (a transform's ``ctx.batch_index``).
    """

    def __init__(self, endpoint: str, message: str, *, epoch: int, batch: int) -> None:
        super().__init__(endpoint, message)
        self.epoch = epoch
        self.batch = batch


class RemoteError(DataflowError):
    """An error raised inside a loader server, carried to the client.

    Attributes:
        endpoint: the server that reported it.
        kind: what failed, the ERROR message's :class:`~dataflow.wire.ErrorKind` (a str
            enum: ``kind == "ReadFailed"`` holds); for ``READ_FAILED`` the message starts with
            the server-side exception class name.
        remote_message: the server's message.
    """

    def __init__(self, endpoint: str, kind: ErrorKind, message: str) -> None:
        super().__init__(f"{endpoint}: {kind}: {message}")
        self.endpoint = endpoint
        self.kind = kind
        self.remote_message = message
