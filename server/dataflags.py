"""The server's flags for which columns a dataset serves and how (``--columns`` ...)."""

from __future__ import annotations

import argparse

from dataflow.convert.columns import DECIMAL, DICTIONARY, NULLS, ReadOptions, parse_fill


def add_data_flags(p: argparse.ArgumentParser) -> None:
    """Add the column, null, type and split flags to the server's parser."""
    g = p.add_argument_group(
        "data", "which fields of Arrow/Parquet shards are served and how (docs/data.md); "
                "a field is named as served: a struct column `image` serves `image.bytes` "
                "and `image.path`, and naming `image` means both")
    g.add_argument("--columns", nargs="+", default=None, metavar="FIELD",
                   help="serve only these fields (default: all but pandas index columns)")
    g.add_argument("--drop-columns", nargs="+", default=(), metavar="FIELD",
                   help="do not serve these fields (e.g. one of a type that is refused)")
    g.add_argument("--nulls", default="mask", choices=NULLS,
                   help="fields holding nulls: serve a bool FIELD.valid mask beside them, "
                        "null slots holding zero/empty (mask), or require a --fill-value for "
                        "each (fill); either way checked when the index is built "
                        "(default: %(default)s)")
    g.add_argument("--fill-value", nargs="+", default=(), metavar="FIELD=VALUE",
                   help="value served in FIELD's null slots (and null list items), as text "
                        "cast to the served type; such a field gets no mask")
    g.add_argument("--dictionary", default="values", choices=DICTIONARY,
                   help="dictionary (pandas category) columns as their values or their "
                        "integer codes (default: %(default)s)")
    g.add_argument("--decimal", default="refuse", choices=DECIMAL,
                   help="decimal columns: refused naming the field, or served as float64 "
                        "(lossy beyond ~15 digits) or as text (default: %(default)s)")
    g.add_argument("--index-columns", action="store_true",
                   help="serve pandas index columns (__index_level_0__, ...), left out by "
                        "default")
    g.add_argument("--split", default=None, metavar="NAME",
                   help="the split to serve when --data is a Hugging Face DatasetDict root "
                        "(required there: serving the root would merge its splits)")


def read_options(ns: argparse.Namespace) -> ReadOptions:
    """The :class:`ReadOptions` the parsed flags ask for.

    Raises:
        ConfigError: a flag value is invalid.
    """
    return ReadOptions(
        columns=tuple(ns.columns) if ns.columns is not None else None,
        drop=tuple(ns.drop_columns), nulls=ns.nulls, fill=parse_fill(ns.fill_value),
        dictionary=ns.dictionary, decimal=ns.decimal, index_columns=ns.index_columns,
    )
