"""Weighted mixtures and lineage with real servers: an Arrow source and a tar source of
different sizes; exactly once per pass over each source, the proportions of every batch,
elastic resume, per-source counters and metrics, schemas that differ, lineage of every sample
also when a server leaves damaged samples out."""

from __future__ import annotations

import io
import json
import pickle
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry
from srvtools import run_ranks, write_damaged_parquet

from dataflow.client import DataLoader, MixtureLoader, Origin, Source
from dataflow.demo import DemoSpec, make_demo
from dataflow.errors import SchemaMismatchError, StateMismatchError
from dataflow.mixture import Weights

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BATCH = 10
SMALL = (3, 4, 4)


@pytest.fixture(scope="module")
def books(tmp_path_factory: pytest.TempPathFactory):
    """A small tar dataset (2 shards, 37 samples): upsampled in a mixture."""
    out = tmp_path_factory.mktemp("books")
    return make_demo(str(out), DemoSpec(fmt="tar", shards=2, samples_per_shard=18, seed=4,
                                        image_shape=(3, 8, 8)), progress=None)


def _web(servers, demo_data):
    demo = demo_data("arrow")
    return demo, servers([str(p) for p in demo.paths]).endpoint


def _mixture(web: str, books: str, rank: int = 0, world: int = 1, **kw) -> MixtureLoader:
    return MixtureLoader([Source(web, 0.7, name="web"), Source(books, 0.3, name="books")],
                         batch_size=BATCH, rank=rank, world_size=world, seed=5, timeout=20,
                         lineage=True, **kw)


def _offsets(demo) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(demo.sizes)])


def _origins(loader: MixtureLoader, batch) -> list[tuple[str, int]]:
    """(source, id) of each sample of a batch, checked against its lineage: demo ids number
    a dataset's samples in shard order, so a sample's shard and row give its id."""
    return [(o.source, int(i)) for o, i in zip(loader.lineage(batch), batch["id"].tolist(),
                                                strict=True)]


def _check_lineage(loader: MixtureLoader, batch, demos: dict) -> None:
    for origin, sample in zip(loader.lineage(batch), batch["id"].tolist(), strict=True):
        demo = demos[origin.source]
        shard = [Path(p).name for p in demo.paths].index(origin.shard)
        assert _offsets(demo)[shard] + origin.row == sample, origin


@pytest.mark.timeout(120)
def test_two_ranks_read_each_source_exactly_once_per_pass_in_exact_proportions(
        servers, demo_data, books) -> None:
    web_demo, web = _web(servers, demo_data)
    book = servers([str(p) for p in books.paths]).endpoint
    demos = {"web": web_demo, "books": books}
    epochs = 3

    def rank(r: int):
        seen, counts = [], []
        with _mixture(web, book, rank=r, world=2) as ml:
            for epoch in range(epochs):
                ml.set_epoch(epoch)
                n = 0
                for batch in ml:
                    _check_lineage(ml, batch, demos)
                    got = _origins(ml, batch)
                    seen += got
                    counts.append(Counter(s for s, _ in got))
                    n += 1
                assert n == len(ml)
            return seen, counts, ml.stats(), ml.samples_per_epoch, len(ml)

    (seen0, counts0, stats0, per_epoch, n), (seen1, counts1, _, _, n1) = run_ranks(
        2, rank, timeout=100)
    assert n == n1 and per_epoch == web_demo.total + books.total
    full = [c for c in counts0 + counts1 if c.total() == BATCH]
    assert len(full) >= 2 * epochs * (n - 1) and all(c == {"web": 7, "books": 3} for c in full)
    assert stats0["sources"]["web"]["samples"] == sum(1 for s, _ in seen0 if s == "web")
    assert stats0["batches"] == epochs * n
    # every sample of a source once per pass over it, plus the padding of each epoch's tail
    # (fewer than 2 samples: the epoch's first ones again)
    weights = Weights.of([0.7, 0.3])
    seen = Counter(seen0 + seen1)
    for k, (name, demo) in enumerate(demos.items()):
        taken = weights.taken(epochs * per_epoch)[k]
        mine = Counter({i: c for (s, i), c in seen.items() if s == name})
        padding = mine.total() - taken
        assert 0 <= padding < 2 * epochs, (name, padding)
        passes, rest = divmod(taken, demo.total)
        assert min(mine[i] for i in range(demo.total)) >= passes
        assert sum(c - passes for c in mine.values()) == rest + padding
    assert weights.taken(epochs * per_epoch)[1] > 2 * books.total  # books: upsampled


@pytest.mark.timeout(120)
def test_resume_on_another_world_size_reads_what_the_uninterrupted_run_reads(
        servers, demo_data, books) -> None:
    """120 samples an epoch: 2 ranks read 2 batches each of epoch 1, then 4 ranks the other 80
    (no padding either way); the union is one rank's whole epoch, and a resume on the same
    world size reads exactly the uninterrupted batches."""
    _, web = _web(servers, demo_data)
    book = servers([str(p) for p in books.paths]).endpoint
    kw = dict(samples_per_epoch=120)
    with _mixture(web, book, **kw) as ml:
        ml.set_epoch(1)
        whole = [_origins(ml, b) for b in ml]
    assert len(whole) == 12

    def head(r: int):
        with _mixture(web, book, rank=r, world=2, **kw) as ml:
            ml.set_epoch(1)
            it = iter(ml)
            got = [_origins(ml, next(it)) for _ in range(2)]
            return got, ml.state_dict()

    heads = run_ranks(2, head, timeout=60)
    state = heads[0][1]
    assert state == heads[1][1] and state["consumed"] == 40 and state["world_size"] == 2
    assert [s["position"] for s in state["sources"]] == [84 + 28, 36 + 12]  # epoch 0 + 40 slots

    def tail(r: int):
        with _mixture(web, book, rank=r, world=4, **kw) as ml:
            ml.load_state_dict(state)
            ml.set_epoch(1)
            return [_origins(ml, b) for b in ml]

    tails = run_ranks(4, tail, timeout=60)
    assert [len(t) for t in tails] == [2] * 4
    chained = Counter(x for h, _ in heads for b in h for x in b)
    chained.update(x for t in tails for b in t for x in b)
    assert chained == Counter(x for b in whole for x in b)
    with _mixture(web, book, **kw) as ml:
        ml.load_state_dict(heads[0][1] | {"world_size": 1})
        ml.set_epoch(1)
        assert len([b for b in ml]) == 8
    with _mixture(web, book, **kw) as ml:
        ml.set_epoch(1)
        it = iter(ml)
        first = [_origins(ml, next(it)) for _ in range(5)]
        mid = ml.state_dict()
    with _mixture(web, book, **kw) as ml:
        ml.load_state_dict(mid)
        assert first + [_origins(ml, b) for b in ml] == whole
    with _mixture(web, book, samples_per_epoch=100) as ml, pytest.raises(
            StateMismatchError, match="samples_per_epoch"):
        ml.load_state_dict(mid)


@pytest.mark.timeout(90)
def test_per_source_counters_reach_stats_and_metrics_and_a_pickled_loader_reads_alike(
        servers, demo_data, books) -> None:
    _, web = _web(servers, demo_data)
    book = servers([str(p) for p in books.paths]).endpoint
    registry = CollectorRegistry()
    with _mixture(web, book, samples_per_epoch=50, metrics=registry) as ml:
        batches = [b for b in ml]
        stats = ml.stats()
        assert stats["sources"]["web"]["samples"] == 35 and stats["sources"]["books"][
            "samples"] == 15
        assert stats["sources"]["web"]["batches"] == stats["sources"]["books"]["batches"] == 5
        assert stats["batches"] == len(batches) == 5
        for name, want in (("web", 35), ("books", 15)):
            got = registry.get_sample_value("dataflow_client_source_samples_total",
                                            {"rank": "0", "source": name})
            assert got == want
        assert registry.get_sample_value("dataflow_client_batches_total", {"rank": "0"}) == 5
        with pickle.loads(pickle.dumps(ml)) as again:  # its configuration: a new loader
            assert [_origins(again, b) for b in again] == [_origins(ml, b) for b in batches]
            assert again.stats()["sources"]["books"]["samples"] == 15
    assert registry.get_sample_value("dataflow_client_source_samples_total",
                                     {"rank": "0", "source": "web"}) is None  # closed


@pytest.mark.timeout(90)
def test_sources_of_other_schemas_concat_their_common_columns_or_come_apart(
        servers, demo_data, tmp_path) -> None:
    _, web = _web(servers, demo_data)
    path = tmp_path / "tokens.parquet"
    pq.write_table(pa.table({"id": np.arange(30, dtype=np.int64) + 1000,
                             "tokens": pa.array([list(range(i % 5)) for i in range(30)],
                                                pa.list_(pa.int32()))}), path)
    tokens = servers([str(path)]).endpoint
    both = [Source(web, 3, name="web"), Source(tokens, 1, name="tokens")]
    with pytest.raises(SchemaMismatchError, match="between source 'web' and source 'tokens'"):
        MixtureLoader(both, batch_size=8, timeout=20)
    common = [Source(web, 3, name="web", columns=["id"]),
              Source(tokens, 1, name="tokens", columns=["id"])]
    with MixtureLoader(common, batch_size=8, timeout=20, samples_per_epoch=40) as ml:
        batches = [b for b in ml]
    assert all(set(b) == {"id"} and len(b["id"]) == 8 for b in batches)
    ids = [i for b in batches for i in b["id"].tolist()]
    assert sum(i >= 1000 for i in ids) == 10 and len(set(ids)) == 40
    with MixtureLoader(both, batch_size=8, timeout=20, samples_per_epoch=40,
                       combine="sources", lineage=True) as ml:
        batch = next(iter(ml))
        assert set(batch) == {"web", "tokens"}
        assert len(batch["web"]["id"]) == 6 and len(batch["tokens"]["id"]) == 2
        assert "tokens.offsets" in batch["tokens"] and "image" in batch["web"]
        origins = ml.lineage(batch)
    assert [o.source for o in origins] == ["web"] * 6 + ["tokens"] * 2
    assert [o.row for o in origins[6:]] == [i - 1000 for i in batch["tokens"]["id"].tolist()]


@pytest.mark.timeout(90)
def test_lineage_leaves_out_what_the_server_left_out(servers, tmp_path) -> None:
    """``--on-error skip``: the damaged row group's samples are not in the batches, and the
    lineage of every sample that is names its own row, in batches of one request each and of
    several (without reading ahead, which would count the next epoch's skips too)."""
    path = tmp_path / "p.parquet"
    write_damaged_parquet(str(path))
    server = servers([str(path)], extra_args=["--on-error", "skip"])
    for per_request in (1, 4):
        with DataLoader(server.endpoint, batch_size=8, seed=1, timeout=20, lineage=True,
                        batches_per_request=per_request, read_ahead=False) as dl:
            rows = []
            for batch in dl:
                origins = dl.lineage(batch)
                assert [o.row for o in origins] == batch["x"].tolist()
                assert {o.shard for o in origins} == {"p.parquet"}
                assert batch["lineage.source"].tolist() == [0] * len(origins)
                rows += batch["x"].tolist()
            assert sorted(rows) == [i for i in range(60) if not 20 <= i < 30]
            assert dl.stats()["skipped"] == 10
    other = servers([str(path)], extra_args=["--on-error", "skip"]).endpoint
    with MixtureLoader([Source(server.endpoint, 1, name="a"), Source(other, 1, name="b")],
                       batch_size=6, timeout=20, lineage=True, read_ahead=False) as ml:
        for batch in ml:
            origins = ml.lineage(batch)
            assert [o.row for o in origins] == batch["x"].tolist()
            assert all(isinstance(o, Origin) for o in origins)
        assert ml.stats()["skipped"] == 20


@pytest.mark.timeout(60)
def test_lineage_rows_of_a_shard_the_index_left_samples_out_of_are_unknown(servers,
                                                                           tmp_path) -> None:
    """``--missing-field skip`` drops sample 1 of ``b.tar`` while the index is built: the
    samples after it are served one row early, so their rows are -1 (not another sample's);
    ``a.tar``'s rows are its own."""
    for name, lacking in (("a.tar", None), ("b.tar", 1)):
        with tarfile.open(tmp_path / name, "w") as tf:
            for i in range(5):
                members = {"id": str(i).encode(), "cls": b"7"}
                if i == lacking:
                    del members["cls"]
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
    server = servers([str(tmp_path / "a.tar"), str(tmp_path / "b.tar")],
                     extra_args=["--missing-field", "skip"])
    with DataLoader(server.endpoint, batch_size=9, shuffle=False, timeout=20,
                    lineage=True) as dl:
        (batch,) = list(dl)
        origins = dl.lineage(batch)
    assert [(o.shard, o.row) for o in origins] == [("a.tar", i) for i in range(5)] + [
        ("b.tar", -1)] * 4
    with MixtureLoader([Source(server.endpoint, 1, name="tars")], batch_size=9, timeout=20,
                       lineage=True) as ml:
        (batch,) = list(ml)
        origins = ml.lineage(batch)
    assert sorted((o.shard, o.row) for o in origins) == [("a.tar", i) for i in range(5)] + [
        ("b.tar", -1)] * 4


@pytest.mark.timeout(90)
def test_a_tiny_source_named_twice_in_a_batch_is_repeated_in_it(servers, tmp_path) -> None:
    """A source of 3 samples at half of batches of 8: each batch names its samples more than
    once (read once per request, repeated on the trainer), its lineage too."""
    tiny = make_demo(str(tmp_path / "tiny"), DemoSpec(fmt="arrow", shards=1,
                                                      samples_per_shard=3, uneven=False,
                                                      image_shape=SMALL), progress=None)
    big = make_demo(str(tmp_path / "big"), DemoSpec(fmt="tar", shards=2, samples_per_shard=20,
                                                    uneven=False, image_shape=SMALL),
                    progress=None)
    a = servers([str(p) for p in tiny.paths]).endpoint
    b = servers([str(p) for p in big.paths]).endpoint
    with MixtureLoader([Source(a, 1, name="tiny"), Source(b, 1, name="big")], batch_size=8,
                       timeout=20, lineage=True, samples_per_epoch=48) as ml:
        for batch in ml:
            origins = ml.lineage(batch)
            tiny_ids = [i for o, i in zip(origins, batch["id"].tolist(), strict=True)
                        if o.source == "tiny"]
            assert len(tiny_ids) == 4 and set(tiny_ids) <= {0, 1, 2}
            assert [o.row for o in origins if o.source == "tiny"] == tiny_ids
            texts = [bytes(batch["text"][a:b].tolist()).decode() for a, b in zip(
                batch["text.offsets"][:-1].tolist(), batch["text.offsets"][1:].tolist(),
                strict=True)]
            assert all(t.startswith(f"sample {i} ") for t, i in zip(texts, batch["id"].tolist(),
                                                                    strict=True))
        assert ml.stats()["sources"]["tiny"]["samples"] == 24


@pytest.mark.timeout(90)
def test_the_example_runs_end_to_end(tmp_path) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "mixture.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=80, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["per_batch"] == {"web": 7, "books": 3}
    assert summary["resumed_equal"] is True
    assert summary["books_passes"] == 3 and summary["web_once"] is True
    assert summary["samples"] == {"web": 280, "books": 120}

