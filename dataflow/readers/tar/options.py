"""The WebDataset conventions a tar reader follows (:class:`TarOptions`)."""

from __future__ import annotations

from dataclasses import dataclass

from dataflow.errors import ConfigError

KEY_FIELD = "__key__"
"""The field holding each sample's WebDataset key (``TarOptions(keys=True)``)."""
MISSING_FIELD = ("error", "skip", "fill")
"""What becomes of a sample lacking some of the shard's fields (see
:meth:`dataflow.readers.tar.build._Builder.fits`)."""


@dataclass(frozen=True)
class TarOptions:
    """WebDataset conventions a tar reader follows.

    Attributes:
        keys: add each sample's key (its members' path up to the first dot of the base name,
            ``dir/000017`` for ``dir/000017.jpg``) as the ``str`` field ``__key__``.
        missing_field: a sample lacking some of the fields most samples of its shard have:
            ``"error"`` (damaged: ``on_error`` decides), ``"skip"`` (left out and counted as
            skipped, whatever ``on_error``) or ``"fill"`` (served with the field empty:
            ``b""`` / ``""`` for bytes and text, :data:`~dataflow.readers.tar.index.FILL_INT`
            for integers, zeros for ``.npy`` arrays).
    """

    keys: bool = False
    missing_field: str = "error"

    def __post_init__(self) -> None:
        if self.missing_field not in MISSING_FIELD:
            raise ConfigError(f"`missing_field` must be one of {MISSING_FIELD}. "
                              f"Found: {self.missing_field!r}")


DEFAULT_OPTIONS = TarOptions()
