"""The one rule for integer arguments, and every validator following it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dataflow import wire
from dataflow.checks import as_int, check_int
from dataflow.errors import ConfigError, FieldError, ProtocolError, StateMismatchError
from dataflow.index import DatasetIndex
from dataflow.plan import rank_batches
from dataflow.server.config import ServerConfig
from dataflow.storage.remote import RemoteConfig
from dataflow.storage.throttle import Backoff
from dataflow.transform import TransformContext, batch_seed
from dataflow.wire.fields import integer

INTEGERS = [3, np.int64(3), np.uint8(3), np.array(3)]
NOT_INTEGERS = [True, False, np.bool_(True), 3.0, np.float32(3), "3", None, [3], np.array([3])]


@pytest.mark.parametrize("value", INTEGERS)
def test_integers_of_any_kind_are_plain_ints(value: object) -> None:
    assert as_int(value) == 3 and type(as_int(value)) is int
    assert type(check_int("n", value, 0, 3)) is int


@pytest.mark.parametrize("value", NOT_INTEGERS)
def test_bools_floats_and_the_rest_are_not_integers(value: object) -> None:
    assert as_int(value) is None
    with pytest.raises(ConfigError, match=r"^`n` must be an integer >= 0\. Found: "):
        check_int("n", value)


def test_the_message_names_the_range_and_the_value_found() -> None:
    with pytest.raises(ConfigError, match=r"^`n` must be an integer in \[1, 4\]\. Found: 5$"):
        check_int("n", 5, 1, 4)
    with pytest.raises(StateMismatchError,
                       match=r"^`x` of the state_dict must be an integer >= 2\. Found: 1$"):
        check_int("x", 1, 2, error=StateMismatchError, of="the state_dict")


@pytest.mark.parametrize("check", [
    lambda v: ServerConfig(("x",), workers=v).workers,
    lambda v: RemoteConfig(max_concurrency=v).max_concurrency,
    lambda v: Backoff(max_retries=v).max_retries,
    lambda v: DatasetIndex(("a",), (v,), (), ("i",)).sizes[0],
    lambda v: TransformContext(v, 0, 0).seed,
    lambda v: (batch_seed(v, 0, 0), v)[1],
    lambda v: (rank_batches([4], world_size=v, rank=0, epoch=0, seed=0, batch_size=1), v)[1],
    lambda v: integer(0, 10)(v),
], ids=["server", "remote", "backoff", "index", "context", "seed", "plan", "wire"])
def test_every_validator_follows_the_rule(check) -> None:
    assert check(np.int64(3)) == 3
    for bad in (True, 3.0):
        with pytest.raises((ConfigError, FieldError)):
            check(bad)


def test_stored_values_are_plain_ints() -> None:
    assert type(ServerConfig(("x",), workers=np.int64(2)).workers) is int
    assert type(DatasetIndex(("a",), (np.int32(5),), (), ("i",)).sizes[0]) is int
    assert type(TransformContext(np.uint16(1), 0, 0).seed) is int


def test_the_wire_refuses_a_json_true_as_an_integer() -> None:
    header = {"magic": wire.MAGIC, "version": wire.VERSION, "kind": int(wire.Kind.HELLO),
              "credits": True, "client": ""}
    with pytest.raises(ProtocolError, match=r"HELLO header field `credits`: must be an "
                                            r"integer in \[1, 65536\]\. Found: True"):
        wire.decode([json.dumps(header).encode()])
