"""The wire protocol between loader servers and trainer clients: the one package for it.

* :mod:`~dataflow.wire.messages`: kinds, error kinds, one frozen dataclass per kind;
* :mod:`~dataflow.wire.table`: :class:`MessageSpec` (how a kind travels) and :class:`Codec`
  (encoder and validating decoder of a table of kinds);
* :mod:`~dataflow.wire.codec`: the wire's table of kinds (:data:`SPECS`), :func:`encode`,
  :func:`decode`, :func:`decode_header`, :func:`parse_header` (a header, then the rest);
* :mod:`~dataflow.wire.layout`: :class:`BatchLayout`, where a BATCH's arrays land in one
  receive buffer, and the one check of a BATCH's frames (used by :func:`decode` and by every
  receiver of the client);
* :mod:`~dataflow.wire.arrays`: BATCH validation and ``Batch`` <-> message;
* :mod:`~dataflow.wire.internal`: the frontend <-> reader messages of a server (a table of
  kinds of their own, through a :class:`Codec` too).

This package never imports pyarrow or torch.
"""

from dataflow.wire.arrays import (
    ZERO_COPY_MIN_BYTES,
    array_pieces,
    batch_to_message,
    batches_to_message,
    message_to_batch,
    message_to_batches,
    parts_to_message,
)
from dataflow.wire.codec import SPECS, decode, decode_header, encode, kind_of, parse_header
from dataflow.wire.fields import (
    MAX_BATCH_SIZE,
    MAX_COLUMNS,
    MAX_COLUMNS_BYTES,
    MAX_COUNTER_LIST,
    MAX_CREDITS,
    MAX_GROUP,
    MAX_HEADER_BYTES,
    MAX_INDEX_BYTES,
    MAX_LEFT_OUT_RUNS,
    MAX_NAME,
    MAX_RANGES,
    MAX_SHM_SLOTS,
    MAX_TEXT,
)
from dataflow.wire.layout import (
    ALIGN,
    MAX_FRAME_BYTES,
    BatchLayout,
)
from dataflow.wire.messages import (
    DTYPES,
    MAGIC,
    NO_TAG,
    OFFSETS_SUFFIX,
    VERSION,
    ArraySpec,
    BatchMsg,
    BatchTag,
    Buffer,
    Bye,
    ErrorKind,
    ErrorMsg,
    Heartbeat,
    Hello,
    Index,
    Kind,
    Message,
    Part,
    Request,
    ShmOffer,
    ShmRef,
    Stats,
    StatsReply,
)
from dataflow.wire.table import Codec, Header, MessageSpec

__all__ = [
    "ALIGN", "Codec", "DTYPES", "Header", "MAGIC", "MAX_BATCH_SIZE", "MAX_COLUMNS",
    "MAX_COLUMNS_BYTES", "MAX_COUNTER_LIST", "MAX_CREDITS", "MAX_GROUP",
    "MAX_FRAME_BYTES", "MAX_HEADER_BYTES",
    "MAX_INDEX_BYTES", "MAX_LEFT_OUT_RUNS", "MAX_NAME", "NO_TAG", "MAX_RANGES", "MAX_TEXT", "SPECS",
    "VERSION", "ArraySpec", "BatchLayout", "BatchMsg", "BatchTag", "Buffer", "Bye", "ErrorKind",
    "ErrorMsg", "Heartbeat", "Hello", "Index", "Kind", "Message", "MessageSpec", "Part", "Request",
    "OFFSETS_SUFFIX", "ZERO_COPY_MIN_BYTES", "ShmOffer", "ShmRef", "MAX_SHM_SLOTS",
    "Stats", "StatsReply", "batch_to_message", "batches_to_message", "decode",
    "decode_header", "encode", "kind_of", "message_to_batch", "message_to_batches",
    "parts_to_message", "parse_header", "array_pieces",
]
