"""Decode on the trainer end to end: real JPEG tars, a real server, the CPU (Pillow) decoder.

Shards are WebDataset tars of JPEGs of assorted sizes written by Pillow through webdataset's
``TarWriter``; the server ships their bytes and the DataLoader decodes, crops and flips them.
Each decoded image is checked against a Pillow decode plus the crop the documented rule gives,
computed here independently of the client's code.
"""

from __future__ import annotations

import io
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
import webdataset
from PIL import Image
from srvtools import wait_for

from dataflow.client import DataLoader, ImageDecode, MixtureLoader, Source
from dataflow.errors import DecodeError
from dataflow.mixture import source_seed
from dataflow.transform import batch_seed

SHARDS, PER_SHARD, BATCH, CROP, SEED = 3, 16, 6, 16, 7
DECODE = {"jpg": ImageDecode(size=CROP, flip=True, output="image")}


def _jpeg(rng: np.random.Generator) -> bytes:
    height, width = (int(v) for v in rng.integers(CROP, 40, 2))
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 7 + y * 3 + c * 50) % 256 for c in range(3)], axis=-1)
    noisy = pixels + rng.integers(0, 40, pixels.shape)
    buf = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(buf, format="JPEG",
                                                                  quality=90)
    return buf.getvalue()


def _write(out: Path, jpgs: dict[int, bytes], bad: dict[int, bytes] | None = None
           ) -> list[str]:
    paths = []
    for s in range(SHARDS):
        path = str(out / f"jpeg-{s:04d}.tar")
        with webdataset.TarWriter(path) as w:
            for i in range(PER_SHARD):
                sid = s * PER_SHARD + i
                data = (bad or {}).get(sid, jpgs[sid])
                w.write({"__key__": f"{sid:06d}", "jpg": data, "id": str(sid).encode()})
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def jpeg_tars(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict[int, bytes]]:
    rng = np.random.default_rng(0)
    jpgs = {sid: _jpeg(rng) for sid in range(SHARDS * PER_SHARD)}
    return _write(tmp_path_factory.mktemp("jpeg"), jpgs), jpgs


def _expected(jpg: bytes, seed: int, epoch: int, batch: int, position: int) -> np.ndarray:
    """Pillow decode + the crop and flip of the documented rule, written out here."""
    seq = np.random.SeedSequence(batch_seed(seed, epoch, batch), spawn_key=(zlib.crc32(b"jpg"),))
    u = np.random.Generator(np.random.PCG64(seq)).random((position + 1, 3))[position]
    with Image.open(io.BytesIO(jpg)) as im:
        hwc = np.asarray(im.convert("RGB"))
    top = int(u[0] * (hwc.shape[0] - CROP + 1))
    left = int(u[1] * (hwc.shape[1] - CROP + 1))
    crop = hwc[top : top + CROP, left : left + CROP]
    return (crop[:, ::-1] if u[2] < 0.5 else crop).transpose(2, 0, 1)


Batches = dict[int, dict[str, torch.Tensor]]  # global batch index -> batch


def _read(endpoint: str, *, rank: int = 0, world: int = 1, epoch: int = 0,
          state: dict | None = None, take: int | None = None) -> tuple[Batches, dict]:
    """Batches of one pass by global index (rank r of W reads g = start + j * W + r), and the
    state after them."""
    with DataLoader(endpoint, batch_size=BATCH, rank=rank, world_size=world, seed=SEED,
                    decode=DECODE, timeout=30) as dl:
        assert dl.decode_backend is not None and dl.decode_backend.startswith("pillow")
        start = 0
        if state is not None:
            dl.load_state_dict(state)
            start = state["consumed"] // BATCH
        dl.set_epoch(epoch)
        out: Batches = {}
        it = iter(dl)
        for j, batch in enumerate(it):
            out[start + j * world + rank] = batch
            if take is not None and j + 1 == take:
                break
        return out, dl.state_dict()


def _check(batches: Batches, jpgs: dict[int, bytes], epoch: int) -> None:
    for g, batch in batches.items():
        assert set(batch) == {"image", "id"}
        assert batch["image"].shape == (len(batch["id"]), 3, CROP, CROP)
        assert batch["image"].dtype == torch.uint8
        for p, sid in enumerate(batch["id"].tolist()):
            assert np.array_equal(batch["image"][p].numpy(),
                                  _expected(jpgs[sid], SEED, epoch, g, p)), (g, p, sid)


def _same(a: Batches, b: Batches) -> None:
    assert a.keys() == b.keys()
    for g in a:
        assert torch.equal(a[g]["id"], b[g]["id"]) and torch.equal(a[g]["image"],
                                                                   b[g]["image"]), g


@pytest.mark.timeout(120)
def test_decoded_epochs_are_exact_pillow_crops_and_reproducible(jpeg_tars, servers) -> None:
    paths, jpgs = jpeg_tars
    endpoint = servers(paths, workers=2).endpoint
    first, _ = _read(endpoint)
    ids = torch.cat([b["id"] for b in first.values()]).tolist()
    assert sorted(ids) == list(range(SHARDS * PER_SHARD))  # every sample exactly once
    assert len(first) == SHARDS * PER_SHARD // BATCH
    assert all(len(b["id"]) == BATCH for b in first.values())
    _check(first, jpgs, epoch=0)
    again, _ = _read(endpoint)
    _same(first, again)
    # Two ranks read the same global batches, cropped alike.
    split = {**_read(endpoint, rank=0, world=2)[0], **_read(endpoint, rank=1, world=2)[0]}
    _same(first, split)
    # Another epoch: other crops of the same samples.
    later, _ = _read(endpoint, epoch=1)
    _check(later, jpgs, epoch=1)
    by_id = {sid: b["image"][p] for b in first.values() for p, sid in enumerate(b["id"].tolist())}
    moved = sum(not torch.equal(by_id[sid], b["image"][p])
                for b in later.values() for p, sid in enumerate(b["id"].tolist()))
    assert moved > len(by_id) // 2


@pytest.mark.timeout(120)
def test_the_next_batch_decodes_while_the_consumer_holds_one(jpeg_tars, servers) -> None:
    paths, jpgs = jpeg_tars
    endpoint = servers(paths, workers=2).endpoint
    with DataLoader(endpoint, batch_size=BATCH, rank=0, world_size=1, seed=SEED,
                    decode=DECODE, timeout=30) as dl:
        it = iter(dl)
        got = {0: next(it)}
        # Two batches wait: taking the first, the loader finds the second and decodes it
        # ahead, while the consumer holds the first.
        wait_for(lambda: dl.stats()["waiting"] >= 2, 60, "two batches waiting")
        assert dl.decoded_ahead == 0
        got[1] = next(it)
        got.update({g: b for g, b in enumerate(it, start=2)})
        assert dl.decoded_ahead >= 1
    assert sorted(torch.cat([b["id"] for b in got.values()]).tolist()) == list(
        range(SHARDS * PER_SHARD))
    _check(got, jpgs, epoch=0)


@pytest.mark.timeout(120)
def test_a_resumed_run_decodes_the_same_crops(jpeg_tars, servers) -> None:
    paths, jpgs = jpeg_tars
    endpoint = servers(paths, workers=1).endpoint
    whole, _ = _read(endpoint)
    head, state = _read(endpoint, take=3)
    assert state["consumed"] == 3 * BATCH
    rest, _ = _read(endpoint, state=state)
    assert head.keys().isdisjoint(rest.keys())
    _same(whole, {**head, **rest})
    # Resumed on two ranks: the remaining global batches, the same crops.
    elastic = {**_read(endpoint, rank=0, world=2, state=state)[0],
               **_read(endpoint, rank=1, world=2, state=state)[0]}
    # (5 batches of 6 left over 2 ranks: the last global batches are spread evenly, full
    # batches are the uninterrupted run's)
    _same({g: whole[g] for g in range(3, 7)}, {g: elastic[g] for g in range(3, 7)})
    left = set(torch.cat([whole[g]["id"] for g in range(3, 8)]).tolist())
    assert set(torch.cat([b["id"] for b in elastic.values()]).tolist()) == left
    _check(elastic, jpgs, epoch=0)


@pytest.mark.timeout(120)
def test_a_corrupt_jpeg_raises_naming_field_sample_and_shard(jpeg_tars, servers,
                                                             tmp_path) -> None:
    _, jpgs = jpeg_tars
    bad = PER_SHARD + 5  # shard 1, sample 5: position 5 + 16 = 21 of the unshuffled order
    paths = _write(tmp_path, jpgs, {bad: jpgs[bad][:40]})
    endpoint = servers(paths, workers=1).endpoint
    with DataLoader(endpoint, batch_size=4, rank=0, world_size=1, shuffle=False,
                    decode=DECODE, timeout=30) as dl:
        it = iter(dl)
        got = [next(it)["id"].tolist() for _ in range(5)]
        assert got == [list(range(4 * j, 4 * j + 4)) for j in range(5)]
        with pytest.raises(DecodeError) as e:
            next(it)
        assert str(e.value).startswith("decode of field 'jpg' failed at sample 1 of batch 5 "
                                       "of epoch 0 (jpeg-0001.tar, sample 5): ")
        assert (e.value.field, e.value.position, e.value.shard, e.value.sample) == (
            "jpg", 1, "jpeg-0001.tar", 5)
        with pytest.raises(DecodeError):  # never a silently short epoch
            next(it)
        # The failed batch was not consumed: a resume starts at it.
        assert dl.state_dict()["consumed"] == 5 * 4


@pytest.mark.timeout(120)
def test_a_field_that_is_not_bytes_is_named(jpeg_tars, servers) -> None:
    paths, _ = jpeg_tars
    endpoint = servers(paths, workers=1).endpoint
    with DataLoader(endpoint, batch_size=4, rank=0, world_size=1, timeout=30,
                    decode={"id": ImageDecode()}) as dl, pytest.raises(DecodeError) as e:
        next(iter(dl))
    assert "decode of field 'id' in batch 0 of epoch 0: not a bytes field: a fixed-size " \
           "torch.int64 field of shape (4,)" in str(e.value)


@pytest.mark.timeout(120)
def test_a_mixture_decodes_each_source_s_part_with_its_own_draws(jpeg_tars, servers) -> None:
    """Two sources on the same server (two sessions): each part of a batch is decoded alone,
    its crops drawn with its source's seed (``source_seed``), position by position."""
    paths, jpgs = jpeg_tars
    endpoint = servers(paths, workers=1).endpoint
    sources = [Source(endpoint, 2, name="a"), Source(endpoint, 1, name="b")]
    with MixtureLoader(sources, batch_size=BATCH, seed=SEED, decode=DECODE, timeout=30,
                       lineage=True, samples_per_epoch=36) as ml:
        batches = list(ml)
        assert ml.stats()["sources"]["a"]["samples"] == 24
    assert len(batches) == 6
    for g, batch in enumerate(batches):
        origins = ml.lineage(batch)
        assert [o.source for o in origins] == ["a"] * 4 + ["b"] * 2
        for p, sid in enumerate(batch["id"].tolist()):
            k, at = (0, p) if p < 4 else (1, p - 4)
            assert np.array_equal(batch["image"][p].numpy(),
                                  _expected(jpgs[sid], source_seed(SEED, k), 0, g, at)), (g, p)
