"""A client-chosen column subset, end to end: real servers, real Parquet written by pyarrow.

The dataset holds a struct (``meta``, nullable: masks on its children), ragged fields (text,
a list) and a nullable int (``count`` with its mask).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from srvtools import RawClient, ragged_rows, scrape, wait_for

from dataflow import wire
from dataflow.client import DataLoader
from dataflow.errors import RemoteError

SIZES = (17, 23, 9)
TOTAL = sum(SIZES)
BATCH = 8
SERVED = ["id", "label", "meta.source", "meta.source.valid", "meta.score", "meta.score.valid",
          "text", "tags", "count", "count.valid"]
RAGGED = ("meta.source", "text", "tags")


def _sample(i: int) -> dict[str, object]:
    """What sample ``i`` holds in a DataLoader batch (ragged fields as bytes or lists, a null
    float as ``"NaN"``)."""
    meta = i % 5 != 0
    return {"id": i, "label": i % 7, "meta.source": f"s{i}".encode() if meta else b"",
            "meta.source.valid": meta, "meta.score": i / 4 if meta else "NaN",
            "meta.score.valid": meta, "text": f"text {i}".encode(), "tags": list(range(i % 3)),
            "count": 10 * i if i % 6 else 0, "count.valid": i % 6 != 0}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("columns")
    meta_type = pa.struct([("source", pa.string()), ("score", pa.float64())])
    paths, first = [], 0
    for k, n in enumerate(SIZES):
        ids = range(first, first + n)
        table = pa.table({
            "id": pa.array(ids, pa.int64()),
            "label": pa.array([i % 7 for i in ids], pa.int64()),
            "meta": pa.array([{"source": f"s{i}", "score": i / 4} if i % 5 else None
                              for i in ids], meta_type),
            "text": pa.array([f"text {i}" for i in ids], pa.string()),
            "tags": pa.array([list(range(i % 3)) for i in ids], pa.list_(pa.int64())),
            "count": pa.array([10 * i if i % 6 else None for i in ids], pa.int64()),
        })
        paths.append(str(root / f"part-{k}.parquet"))
        pq.write_table(table, paths[-1])
        first += n
    return paths


def _keys(columns: Sequence[str]) -> set[str]:
    """The entries of a DataLoader batch holding ``columns`` of :data:`SERVED` (exact names)."""
    return {*columns, *(f"{c}.offsets" for c in columns if c in RAGGED)}


def _check(batch: dict, keys: set[str]) -> list[int]:
    """Check that ``batch`` has exactly ``keys`` and each sample's values; its ids."""
    got = {k: v.numpy() for k, v in batch.items()}
    assert set(got) == keys
    ids = got["id"].tolist()
    for name in keys - {"id"}:
        if name.endswith(".offsets"):
            continue
        if name in RAGGED:
            values = [r.tobytes() if r.dtype == np.uint8 else r.tolist()
                      for r in ragged_rows(got, name)]
        else:
            values = ["NaN" if v != v else v for v in got[name].tolist()]  # a null float
        assert values == [_sample(i)[name] for i in ids], name
    return ids


def _epoch(endpoint: str, columns: Sequence[str], fields: Sequence[str]) -> Counter[int]:
    """One epoch of one rank asking for ``columns``, each batch checked to hold exactly
    ``fields``; how often each id came."""
    seen: Counter[int] = Counter()
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, timeout=30, seed=1,
                    pin_memory=False, columns=columns) as dl:
        assert [f.name for f in dl.schema] == SERVED
        keys = _keys(fields)
        for batch in dl:
            seen.update(_check(batch, keys))
    return seen


@pytest.mark.timeout(120)
def test_a_loader_gets_exactly_the_asked_fields_and_every_sample_once(shards, servers) -> None:
    endpoint = servers(shards, workers=2).endpoint
    for columns, fields in (
            (["id", "meta"], ["id", "meta.source", "meta.source.valid", "meta.score",
                              "meta.score.valid"]),
            (["text", "id"], ["id", "text"]),
            (["id", "tags", "count"], ["id", "tags", "count", "count.valid"]),
            (["id", "meta.score", "count.valid"], ["id", "meta.score", "meta.score.valid",
                                                   "count.valid"])):
        assert _epoch(endpoint, columns, fields) == Counter(range(TOTAL)), columns


@pytest.mark.timeout(120)
def test_two_clients_with_different_columns_on_one_server_get_their_own(shards,
                                                                        servers) -> None:
    endpoint = servers(shards, workers=2).endpoint
    wants: list[list[str] | None] = [["id", "text"], ["meta", "id"], None]
    loaders = [DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, timeout=30,
                          pin_memory=False, seed=s, columns=c) for s, c in enumerate(wants)]
    try:
        keys = [_keys(["id", "text"]), _keys(["id", *SERVED[2:6]]), _keys(SERVED)]
        seen: list[Counter[int]] = [Counter() for _ in loaders]
        # Interleaved: the three sessions have requests at the readers at the same time.
        for batches in zip(*loaders, strict=True):
            for k, batch in enumerate(batches):
                seen[k].update(_check(batch, keys[k]))
    finally:
        for dl in loaders:
            dl.close()
    assert seen == [Counter(range(TOTAL))] * 3


@pytest.mark.timeout(60)
def test_an_unknown_column_fails_the_constructor_naming_it_and_counts_a_refusal(
        shards, servers) -> None:
    server = servers(shards, extra_args=["--metrics-port", "0"])
    with pytest.raises(RemoteError, match=r"ProtocolError: HELLO `columns` names field\(s\) "
                                          r"\['nope', 'meta.nope'\] this server does not "
                                          r"serve; it serves \['id', 'label'") as info:
        DataLoader(server.endpoint, batch_size=BATCH, rank=0, world_size=1, timeout=30,
                   columns=["id", "nope", "meta", "meta.nope"])
    assert info.value.endpoint == server.endpoint and str(SERVED) in str(info.value)
    port = server.ready["metrics_port"]
    refused = ("dataflow_refusals_total", (("what", "request"),))
    wait_for(lambda: scrape(port).get(refused) == 1, 10, "the refused HELLO in /metrics")
    probe = RawClient(server.endpoint)
    try:
        stats = probe.stats()
        assert stats["refused"] == 1 and stats["sessions_refused"] == 0
        assert stats["clients"] == 1  # the probe's own session only
    finally:
        probe.close()


@pytest.mark.timeout(60)
def test_a_column_the_server_drops_is_refused_and_no_session_is_opened(
        shards, servers, raw_client) -> None:
    server = servers(shards, extra_args=["--drop-columns", "meta"])
    raw = raw_client(server.endpoint)
    refused = raw.call(wire.Hello(2, "cols", columns=("id", "meta.score")))
    assert isinstance(refused, wire.ErrorMsg) and refused.kind is wire.ErrorKind.PROTOCOL
    assert refused.req_id == -1
    assert refused.message == ("HELLO `columns` names field(s) ['meta.score'] this server does "
                               "not serve; it serves ['id', 'label', 'text', 'tags', 'count', "
                               "'count.valid']")
    unknown = raw.call(wire.Stats())
    assert isinstance(unknown, wire.ErrorMsg) and unknown.kind is wire.ErrorKind.UNKNOWN_CLIENT
    with pytest.raises(RemoteError, match=r"names field\(s\) \['meta'\]"):
        DataLoader(server.endpoint, batch_size=BATCH, rank=0, world_size=1, timeout=30,
                   columns=["meta"])
    index = raw.call(wire.Hello(2, "cols", columns=("id", "count")))
    assert isinstance(index, wire.Index)
    assert raw.stats()["refused"] == 2
