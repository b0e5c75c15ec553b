"""The MixtureLoader's pure parts: sources' demands kept in step with the mixture's stream
(peeks, read-ahead, resume), its state, its settings; batches put together and repeated;
lineage of a batch's samples."""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest
import torch

from dataflow.client import DataLoader, LoaderConfig, MixtureConfig, MixtureLoader, Source
from dataflow.client.combine import concat, repeat, samples, signature
from dataflow.client.cursor import EpochCursor, Pass
from dataflow.client.discovery import parse_servers
from dataflow.client.lineage import (
    FIELDS,
    Names,
    Origin,
    attach,
    check_free,
    fields,
    renumbered,
    sample_rows,
)
from dataflow.client.mixstream import MixturePass, Projection, SourcePass
from dataflow.client.state import (
    make_mixture_state,
    make_state,
    read_mixture_state,
    read_state,
)
from dataflow.client.stream import Demand, Stream
from dataflow.errors import (
    ConfigError,
    DatasetMismatchError,
    InternalError,
    SchemaMismatchError,
    StateMismatchError,
)
from dataflow.mixture import Weights, mixture_batches, source_seed

SOURCES = [[30, 12], [7], [50]]
WEIGHTS = Weights.of([5, 2, 1])
PER_EPOCH = 64
BATCH = 8


def _plan(span: Pass, world: int = 1, rank: int = 0) -> MixturePass:
    batches = mixture_batches(SOURCES, WEIGHTS, samples_per_epoch=PER_EPOCH, world_size=world,
                              rank=rank, epoch=span.epoch, seed=3, batch_size=BATCH,
                              start=span.start)
    return MixturePass.of(span, batches, [source_seed(3, k) for k in range(3)])


class Mixture:
    """A mixture stream whose sources' I/O threads have every part at once: each source
    keeps its latest demand and the parts handed over in its stream order."""

    def __init__(self, *, read_ahead: bool = True, depth: int = 3) -> None:
        self.projection = Projection(3)
        self.wanted: list[Demand[SourcePass]] = [Demand()] * 3
        self.taken = [0] * 3
        self.stream: Stream[MixturePass] = Stream(EpochCursor(PER_EPOCH), _plan,
                                                  self._publish, read_ahead=read_ahead)
        self.depth = depth

    def _publish(self, demand: Demand[MixturePass]) -> None:
        for k, d in enumerate(self.projection.project(demand)):
            last = self.wanted[k]
            if d.gen != last.gen:
                assert d.first == 0
                self.taken[k] = 0
            else:  # what a source's Fetch follows: grown, or advanced past parts taken
                assert last.first <= d.first <= self.taken[k] and d.end >= last.end
            self.wanted[k] = d

    def take(self, token: object) -> list[tuple[int, list]] | None:
        """One ``next()``: each part of the batch as its source's stream hands it over."""
        index = self.stream.next(token)
        if index is None:
            return None
        mix, j, firsts = self.projection.locate(index)
        got = []
        for part, i in mix.parts(j):
            k = part.source
            assert self.taken[k] == firsts[k] + i  # the source's next part is this one
            rows, tag = self.wanted[k].batch(self.taken[k])
            assert tag.batch == mix.batches.global_index(j)
            assert tag.seed == source_seed(3, k) and tag.epoch == mix.span.epoch
            self.taken[k] += 1
            got.append((k, rows.tolist()))
        self.stream.took(index, self.depth)
        return got

    def read(self, token: object, k: int | None = None) -> list:
        out = []
        while k is None or len(out) < k:
            batch = self.take(token)
            if batch is None:
                break
            out.append(batch)
        return out


def _cold(span: Pass) -> list:
    planned = _plan(span)
    return [[(p.source, p.rows.tolist()) for p in planned.batches.batch(j)]
            for j in range(len(planned))]


def test_sources_read_their_parts_of_every_batch_in_order_across_read_ahead() -> None:
    m = Mixture(depth=3)
    epochs = [m.read(m.stream.open()) for _ in range(3)]
    assert epochs == [_cold(Pass(e, 0)) for e in range(3)]
    assert all(len(m.wanted[k].passes) <= 2 for k in range(3))


def test_peeks_breaks_resume_and_set_epoch_keep_the_sources_in_step() -> None:
    rng = random.Random(5)
    m = Mixture(depth=2)
    for _ in range(40):
        what = rng.choice(["peek", "break", "full", "resume", "epoch"])
        if what == "peek":
            it = m.stream.open()
            assert m.read(it, 1) == _cold(Pass(m.stream.span.epoch, m.stream.span.start))[:1]
        elif what == "break":
            it = m.stream.open()
            m.read(it, rng.randrange(0, 6))
        elif what == "full":
            it = m.stream.open()
            span = None
            got = []
            while (batch := m.take(it)) is not None:
                span = span or m.stream.span
                got.append(batch)
            if span is not None:
                assert got == _cold(span)
        elif what == "resume":
            m.stream.load(rng.randrange(3), BATCH * rng.randrange(PER_EPOCH // BATCH + 1))
        else:
            m.stream.set_epoch(rng.randrange(3), held=False)


def test_a_demand_that_does_not_follow_raises() -> None:
    p = Projection(3)
    one, two = _plan(Pass(0, 0)), _plan(Pass(1, 0))
    p.project(Demand(1, (one,)))
    with pytest.raises(InternalError, match="starts at batch 3"):
        p.project(Demand(2, (two,), 3))
    with pytest.raises(InternalError, match="from batch 2"):
        p.project(Demand(1, (one, two), 2))
    with pytest.raises(InternalError, match="outside generation 1"):
        p.locate(len(one))


def test_a_source_pass_tags_each_part_with_its_batch_and_cuts_runs_at_passes() -> None:
    mix = _plan(Pass(2, 16), world=2, rank=1)
    tiny = mix.sources[1]  # 7 samples at 2/8 of 64 slots: passes end inside an epoch
    assert tiny.span == Pass(2, 16) and len(tiny) == len(mix.batches.parts[1])
    for i in range(len(tiny)):
        j = int(mix.batches.index[1][i])
        assert tiny.tag(i).batch == 16 // BATCH + 2 * j + 1
        assert i < tiny.run_end(i) <= len(tiny)
    assert tiny.run_end(0) < len(tiny)
    d = Demand(4, (tiny,), 10)
    assert d.run_end(10) == 10 + tiny.run_end(0)


# -- state ------------------------------------------------------------------------------------

PLAN = {"seed": 3, "batch_size": BATCH, "shuffle": "sample", "shuffle_window": 1 << 40,
        "block_size": 64, "window": 8, "drop_last": False}
IDS = [("web", "aa", 42), ("code", "bb", 7), ("books", "cc", 50)]


def _state(**change) -> dict:
    state = make_mixture_state(epoch=2, consumed=24, samples_per_epoch=PER_EPOCH,
                               weights=WEIGHTS, sources=IDS, plan=PLAN, world_size=4)
    state.update(change)
    return state


def test_a_mixture_state_has_each_source_s_position_and_loads_on_any_world_size() -> None:
    state = _state()
    assert [s["position"] for s in state["sources"]] == list(WEIGHTS.taken(2 * PER_EPOCH + 24))
    assert read_mixture_state(state, samples_per_epoch=PER_EPOCH, weights=WEIGHTS,
                              sources=IDS, plan=PLAN) == (2, 24)
    assert read_mixture_state(_state(world_size=7), samples_per_epoch=PER_EPOCH,
                              weights=WEIGHTS, sources=IDS, plan=PLAN) == (2, 24)


@pytest.mark.parametrize("change, error, match", [
    (dict(weights=[5, 2, 2]), StateMismatchError, "`weights`"),
    (dict(samples_per_epoch=65), StateMismatchError, "`samples_per_epoch`"),
    (dict(seed=4), StateMismatchError, "`seed`"),
    (dict(drop_last=0), StateMismatchError, "`drop_last`"),
    (dict(mixture=2), StateMismatchError, "`mixture` must be 1"),
    (dict(consumed=65), StateMismatchError, "`consumed`"),
    (dict(epoch=-1), StateMismatchError, "epoch"),
    (dict(epoch=2**62), StateMismatchError, r"`epoch` of the state_dict must be an integer "
                                            r"in \[0, "),
    (dict(consumed=32), StateMismatchError, "positions"),
    (dict(sources=IDS), StateMismatchError, "`sources`"),
])
def test_a_mixture_state_that_does_not_fit_is_refused(change, error, match) -> None:
    with pytest.raises(error, match=match):
        read_mixture_state(_state(**change), samples_per_epoch=PER_EPOCH, weights=WEIGHTS,
                           sources=IDS, plan=PLAN)


def test_a_mixture_state_of_other_data_names_the_source() -> None:
    other = [IDS[0], ("code", "zz", 7), IDS[2]]
    with pytest.raises(DatasetMismatchError, match="source 1 .'code'. was dataset bb"):
        read_mixture_state(_state(), samples_per_epoch=PER_EPOCH, weights=WEIGHTS,
                           sources=other, plan=PLAN)


def test_states_of_one_loader_are_refused_by_the_other() -> None:
    plain = make_state(epoch=0, consumed=0, total=42, fingerprint="aa", plan=PLAN, world_size=1)
    with pytest.raises(StateMismatchError, match="a DataLoader's"):
        read_mixture_state(plain, samples_per_epoch=PER_EPOCH, weights=WEIGHTS, sources=IDS,
                           plan=PLAN)
    with pytest.raises(StateMismatchError, match="a MixtureLoader's"):
        read_state(_state(), total=42, fingerprint="aa", plan=PLAN)


# -- settings ---------------------------------------------------------------------------------


def test_sources_are_validated_and_named() -> None:
    s = Source("tcp://127.0.0.1:5555", 0.7)
    assert s.name == "tcp://127.0.0.1:5555" and s.servers == parse_servers("tcp://127.0.0.1:5555")
    assert Source(["tcp://a:1", "tcp://b:2"], 3, name="web").name == "web"
    for kwargs, match in ((dict(servers=None, weight=1), "`servers`"),
                          (dict(servers="tcp://a:1", weight=0), "`weight`"),
                          (dict(servers="tcp://a:1", weight="1"), "`weight`"),
                          (dict(servers="tcp://a:1", weight=1, name="x" * 65), "`name`"),
                          (dict(servers="tcp://a:1", weight=1, name="a\nb"), "`name`"),
                          (dict(servers="nope", weight=1), "servers")):
        with pytest.raises(ConfigError, match=match):
            Source(**kwargs)


def _loader_config() -> LoaderConfig:
    return LoaderConfig.of(parse_servers("tcp://a:1"), batch_size=4, rank=0, world_size=1)


def test_a_mixture_config_has_distinct_names_and_its_weights() -> None:
    a, b = Source("tcp://a:1", 0.7, name="web"), Source("tcp://b:1", 0.3, name="books")
    cfg = MixtureConfig((a, b), _loader_config())
    assert cfg.weights.counts == (7, 3)
    assert cfg.source_config(1).servers == parse_servers("tcp://b:1")
    with pytest.raises(ConfigError, match="'web' is given twice"):
        MixtureConfig((a, Source("tcp://b:1", 1, name="web")), _loader_config())
    for kwargs, match in ((dict(sources=()), "`sources`"), (dict(sources=(a, "x")), "`sources`"),
                          (dict(samples_per_epoch=0), "samples_per_epoch"),
                          (dict(combine="stack"), "`combine`")):
        with pytest.raises(ConfigError, match=match):
            MixtureConfig(**{"sources": (a, b), "loader": _loader_config(), **kwargs})


def test_a_mixture_loader_refuses_what_is_a_source_s_or_torch_s_before_connecting() -> None:
    sources = [Source("tcp://127.0.0.1:9", 1)]
    with pytest.raises(ConfigError, match="`columns` is a Source's"):
        MixtureLoader(sources, batch_size=4, columns=["id"])
    with pytest.raises(ConfigError, match="`num_workers` is an argument of torch's"):
        MixtureLoader(sources, batch_size=4, num_workers=2)
    with pytest.raises(TypeError, match="MixtureLoader.. got an unexpected keyword argument "
                                        "'prefetch_depth'"):
        MixtureLoader(sources, batch_size=4, prefetch_depth=2)
    with pytest.raises(ConfigError, match="`sources` must be a list of Source"):
        MixtureLoader(["tcp://127.0.0.1:9"], batch_size=4)
    with pytest.raises(ConfigError, match="`prefetch`"):
        MixtureLoader(sources, batch_size=4, prefetch=0)


def test_loader_config_of_takes_the_data_loader_s_arguments_and_defaults() -> None:
    """A MixtureLoader passes a DataLoader's keyword arguments on to LoaderConfig.of: the
    same names with the same defaults."""
    ours = inspect.signature(LoaderConfig.of).parameters
    theirs = inspect.signature(DataLoader.__init__).parameters
    shared = [n for n in theirs if n not in ("self", "servers", "metrics", "torch_only")]
    assert shared == [n for n in ours if n != "servers"]
    assert all(ours[n].default == theirs[n].default for n in shared)


# -- putting batches together -----------------------------------------------------------------


def _batch(ids: list[int], texts: list[bytes]) -> dict[str, torch.Tensor]:
    offsets = np.cumsum([0, *map(len, texts)])
    return {"id": torch.tensor(ids, dtype=torch.int64),
            "image": torch.arange(len(ids) * 6, dtype=torch.uint8).reshape(-1, 2, 3),
            "text": torch.frombuffer(bytearray(b"".join(texts) or b"\0"),
                                     dtype=torch.uint8)[: offsets[-1]],
            "text.offsets": torch.from_numpy(offsets)}


def _texts(batch: dict[str, torch.Tensor]) -> list[bytes]:
    off = batch["text.offsets"].tolist()
    return [bytes(batch["text"][a:b].tolist()) for a, b in zip(off, off[1:], strict=False)]


def test_concat_puts_parts_one_after_the_other_with_their_offsets() -> None:
    a, b = _batch([1, 2], [b"ab", b""]), _batch([7, 8, 9], [b"x", b"yz", b"w"])
    out = concat([("web", a), ("books", b)])
    assert out["id"].tolist() == [1, 2, 7, 8, 9]
    assert _texts(out) == [b"ab", b"", b"x", b"yz", b"w"]
    assert torch.equal(out["image"], torch.cat([a["image"], b["image"]]))
    assert samples(out) == 5 and concat([("web", a)]) == a


@pytest.mark.parametrize("change, field", [
    (lambda b: b.pop("image"), "'image'"),
    (lambda b: b.update(id=b["id"].to(torch.int32)), "'id'"),
    (lambda b: b.update(image=b["image"].reshape(-1, 3, 2)), "'image'"),
])
def test_concat_of_parts_whose_fields_differ_names_both_sources(change, field) -> None:
    a, b = _batch([1], [b"a"]), _batch([2], [b"b"])
    change(b)
    with pytest.raises(SchemaMismatchError, match=f"field {field} between source 'web' and "
                                                  f"source 'books'"):
        concat([("web", a), ("books", b)])
    assert signature(a)["text"] == ("uint8", None)


def test_repeat_takes_samples_in_any_order_with_repeats() -> None:
    batch = _batch([1, 2, 3], [b"a", b"bc", b""])
    out = repeat(batch, np.array([2, 0, 0, 1]))
    assert out["id"].tolist() == [3, 1, 1, 2] and _texts(out) == [b"", b"a", b"a", b"bc"]
    assert torch.equal(out["image"][1], batch["image"][0]) and samples(out) == 4


# -- lineage ----------------------------------------------------------------------------------


def test_sample_rows_follow_the_ranges_copies_and_samples_left_out() -> None:
    rows = np.array([[0, 3, 5], [2, 0, 1], [2, 7, 9]])
    shard, row = sample_rows(rows)
    assert list(zip(shard.tolist(), row.tolist(), strict=True)) == [
        (0, 3), (0, 4), (2, 0), (2, 7), (2, 8)]
    shard, row = sample_rows(rows, copies=np.array([1, 2, 1, 3, 1]), left_out=(0, 3))
    assert list(zip(shard.tolist(), row.tolist(), strict=True)) == [
        (0, 4), (0, 4), (2, 0), (2, 8)]
    shard, row = sample_rows(rows, left_out=None)
    assert set(shard.tolist()) == set(row.tolist()) == {-1}
    assert renumbered([0, 0, 0]) is None
    unknown = renumbered([0, 0, 2])  # the index left samples of shard 2 out: rows shifted
    shard, row = sample_rows(rows, copies=np.array([1, 2, 1, 3, 1]), left_out=(0,),
                             unknown=unknown)
    assert list(zip(shard.tolist(), row.tolist(), strict=True)) == [
        (0, 4), (0, 4), (2, -1), (2, -1), (2, -1), (2, -1), (2, -1)]


def test_lineage_fields_name_source_shard_and_row() -> None:
    names = Names([("web", ["a.arrow", "b.arrow"]), ("books", ["x.tar"])])
    batch = {"id": torch.zeros(3), **fields(1, np.array([0, 0]), np.array([5, 9]))}
    batch = concat([("web", {"id": torch.zeros(1), **fields(0, np.array([1]), np.array([2]))}),
                    ("books", batch)])
    assert names(batch) == [Origin("web", "b.arrow", 2), Origin("books", "x.tar", 5),
                            Origin("books", "x.tar", 9)]
    unknown = fields(0, np.array([0, 0, 0]), np.array([1, 2, 3]), samples=2)
    assert names(unknown) == [Origin("web", "", -1)] * 2
    with pytest.raises(ConfigError, match="lineage=True"):
        names({"id": torch.zeros(1)})
    assert set(attach({"id": torch.zeros(1)}, fields(0, np.array([0]), np.array([3])))) == {
        "id", *FIELDS}
    with pytest.raises(ConfigError, match="a field 'lineage.source' already"):
        attach(fields(0, np.array([0]), np.array([3])), fields(0, np.array([0]), np.array([3])))
    check_free(["id", "text"], "the dataset")
    with pytest.raises(ConfigError, match="'lineage.row'"):
        check_free(["id", FIELDS[2]], "the dataset")
