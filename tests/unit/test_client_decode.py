"""Trainer-side image decode: the config, the seeded crops and flips, the CPU decode stage.

The GPU decoder is a seam tested under ``tests/cuda``; everything else (the draws, the crop
boxes, the placement on CPU tensors, the Pillow stage and its errors) runs here.
"""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from dataflow.client import DataLoader, Decode, ImageDecode
from dataflow.client.augment import Box, box, draws, place, place_all, place_numpy, place_torch
from dataflow.client.config import LoaderConfig
from dataflow.client.decode import BatchDecoder, Where, as_decode, assemble
from dataflow.client.discovery import parse_servers
from dataflow.client.imaging import NvjpegBackend, PillowBackend, backend_for
from dataflow.errors import ConfigError, DecodeError
from dataflow.transform import batch_seed
from dataflow.wire import BatchTag


@pytest.mark.parametrize("kw, needle", [
    (dict(size=0), "`size` must be an integer >= 1. Found: 0"),
    (dict(size=(224, 0)), "`size[1] (width)` must be an integer >= 1. Found: 0"),
    (dict(size=(1, 2, 3)), "`size` must be an int or a (height, width) pair"),
    (dict(size=2.5), "`size` must be an integer >= 1. Found: 2.5"),
    (dict(size=True), "`size` must be an integer >= 1. Found: True"),
    (dict(size=8, crop="middle"), "`crop` must be one of ('random', 'center'). Found: 'middle'"),
    (dict(crop="center"), "`crop` 'center' needs a `size`"),
    (dict(flip=1), "`flip` must be True or False. Found: 1"),
    (dict(output=""), "`output` must be None or a field name"),
    (dict(output="x.offsets"), "`output` must be None or a field name"),
])
def test_image_decode_refuses(kw, needle) -> None:
    with pytest.raises(ConfigError) as e:
        ImageDecode(**kw)
    assert needle in str(e.value)


def test_image_decode_normalizes_size() -> None:
    assert ImageDecode(size=224).crop_size == (224, 224)
    assert ImageDecode(size=[32, np.int64(48)]).crop_size == (32, 48)
    assert ImageDecode().crop_size is None


@pytest.mark.parametrize("fields, kw, needle", [
    ({}, {}, "`decode` must name at least one field"),
    ([("jpg", ImageDecode())], {}, "must be a mapping of field name -> ImageDecode"),
    ({"jpg": {"size": 3}}, {}, "`decode['jpg']` must be an ImageDecode"),
    ({"": ImageDecode()}, {}, "`decode` keys must be field names"),
    ({"a": ImageDecode(output="b"), "b": ImageDecode()}, {}, "writes field 'b' twice"),
    ({"jpg": ImageDecode()}, dict(backend="gpu"), "`backend` must be one of"),
    ({"jpg": ImageDecode()}, dict(threads=0), "`threads` must be an integer in [1, 64]"),
])
def test_decode_refuses(fields, kw, needle) -> None:
    with pytest.raises(ConfigError) as e:
        Decode(fields, **kw)
    assert needle in str(e.value)


def test_decode_normalizes_and_the_loader_takes_a_mapping() -> None:
    d = Decode({"b": ImageDecode(), "a": ImageDecode(size=8)}, threads=3)
    assert d.items() == (("a", ImageDecode(size=8)), ("b", ImageDecode())) and d.thread_count == 3
    assert Decode({"a": ImageDecode()}).thread_count >= 1
    assert as_decode(None) is None and as_decode(d) is d
    assert as_decode({"a": ImageDecode()}) == Decode({"a": ImageDecode()})
    with pytest.raises(ConfigError, match="`decode` must be None, a mapping"):
        as_decode("jpg")
    cfg = LoaderConfig(servers=parse_servers("tcp://127.0.0.1:5555"), batch_size=4, rank=0,
                       world_size=1, decode={"jpg": ImageDecode(size=4)})  # type: ignore[arg-type]
    assert cfg.decode == Decode({"jpg": ImageDecode(size=4)})
    with pytest.raises(ConfigError, match="`decode` must be None"):
        DataLoader("tcp://127.0.0.1:1", batch_size=4, rank=0, world_size=1,
                   decode=["jpg"])  # type: ignore[arg-type]


def test_backend_choice_without_cuda() -> None:
    auto = backend_for("auto", None, 2)
    assert auto.name == "pillow" and "CPU tensors" in auto.reason
    auto.close()
    with pytest.raises(ConfigError, match="'nvjpeg' needs a CUDA `device`"):
        backend_for("nvjpeg", None, 2)


# -- the seeded draws and crop boxes ---------------------------------------------------------

def test_draws_are_a_pure_function_of_seed_epoch_batch_and_field() -> None:
    base = draws(3, 1, 7, "jpg", 16)
    assert np.array_equal(base, draws(3, 1, 7, "jpg", 16))
    assert base.shape == (16, 3) and ((base >= 0) & (base < 1)).all()
    for other in (draws(4, 1, 7, "jpg", 16), draws(3, 2, 7, "jpg", 16),
                  draws(3, 1, 8, "jpg", 16), draws(3, 1, 7, "png", 16)):
        assert not np.array_equal(base, other)
    assert np.array_equal(draws(3, 1, 7, "jpg", 5), base[:5])  # row i whatever n


def test_draws_follow_the_documented_formula() -> None:
    seq = np.random.SeedSequence(batch_seed(3, 1, 7), spawn_key=(zlib.crc32(b"jpg"),))
    expected = np.random.Generator(np.random.PCG64(seq)).random((4, 3))
    assert np.array_equal(draws(3, 1, 7, "jpg", 4), expected)
    # Not the draws of a server transform on the same batch (ctx.rng()).
    assert not np.array_equal(np.random.default_rng(batch_seed(3, 1, 7)).random((4, 3)),
                              expected)


@pytest.mark.parametrize("height, width", [(8, 8), (9, 8), (40, 33), (300, 200)])
def test_random_boxes_stay_in_bounds_and_cover_every_offset(height, width) -> None:
    h, w = 8, 8
    u = draws(0, 0, 0, "jpg", 4000)
    boxes = [box(row, height, width, (h, w), "random", True) for row in u]
    tops = {b.top for b in boxes}
    lefts = {b.left for b in boxes}
    assert min(tops) == 0 and max(tops) == height - h
    assert min(lefts) == 0 and max(lefts) == width - w
    if height - h + 1 <= 40:
        assert tops == set(range(height - h + 1))
    flips = sum(b.flip for b in boxes)
    assert 1800 < flips < 2200


def test_center_boxes_no_flip_and_too_small() -> None:
    u = np.array([0.99, 0.0, 0.1])
    assert box(u, 40, 30, (8, 10), "center", False) == Box(16, 10, False)
    assert box(u, 40, 30, (8, 10), "center", True) == Box(16, 10, True)
    assert box(u, 40, 30, None, "random", False) == Box(0, 0, False)
    assert box(u, 40, 30, (8, 10), "random", False) == Box(int(0.99 * 33), 0, False)
    with pytest.raises(ValueError, match="the image is 7x30 .* smaller than the crop 8x10"):
        box(u, 7, 30, (8, 10), "random", False)


@pytest.mark.parametrize("how", [place, place_torch,
                                 lambda d, i, b: place_numpy(d.numpy(), i.numpy(), b)])
def test_place_crops_and_flips_cpu_tensors(how) -> None:
    hwc = np.random.default_rng(0).integers(0, 256, (12, 10, 3), dtype=np.uint8)
    image = torch.from_numpy(hwc).permute(2, 0, 1)  # a strided CHW view, as decoders give
    dst = torch.empty((3, 5, 4), dtype=torch.uint8)
    how(dst, image, Box(2, 3, False))
    assert np.array_equal(dst.numpy(), hwc[2:7, 3:7].transpose(2, 0, 1))
    how(dst, image, Box(7, 6, True))
    assert np.array_equal(dst.numpy(), hwc[7:12, 6:10][:, ::-1].transpose(2, 0, 1))


@pytest.mark.parametrize(("n", "height", "width", "size"),
                         [(1, 5, 4, (5, 4)), (7, 12, 10, (5, 4)), (16, 9, 31, (3, 30))])
def test_place_all_equals_place_of_each_sample(n, height, width, size) -> None:
    rng = np.random.default_rng(n)
    hwc = rng.integers(0, 256, (n, height, width, 3), dtype=np.uint8)
    images = torch.from_numpy(hwc).permute(0, 3, 1, 2)  # strided CHW views, as decoders give
    boxes = [box(u, height, width, size, "random", True) for u in rng.random((n, 3))]
    assert {b.flip for b in boxes} == ({True, False} if n > 1 else {boxes[0].flip})
    want = torch.empty((n, 3, *size), dtype=torch.uint8)
    for i in range(n):
        place_numpy(want[i].numpy(), images[i].numpy(), boxes[i])
    got = place_all(images, boxes, size)
    assert got.shape == (n, 3, *size) and got.is_contiguous() and torch.equal(got, want)


def _fail(i: int | None, cause: str) -> DecodeError:
    return DecodeError(f"sample {i}: {cause}", field="f", position=i)


def test_assemble_without_size_needs_one_size() -> None:
    same = [torch.zeros((3, 4, 5), dtype=torch.uint8) + i for i in range(3)]
    out = assemble(same, draws(0, 0, 0, "f", 3), ImageDecode(), _fail)
    assert out.shape == (3, 3, 4, 5) and out.is_contiguous() and out[2].eq(2).all()
    mixed = [*same, torch.zeros((3, 5, 5), dtype=torch.uint8)]
    with pytest.raises(DecodeError, match="sample 3: the image is 5x5, sample 0's 4x5"):
        assemble(mixed, draws(0, 0, 0, "f", 4), ImageDecode(), _fail)
    with pytest.raises(DecodeError, match="sample 0: the image is 4x5 .* smaller than the crop"):
        assemble(same, draws(0, 0, 0, "f", 3), ImageDecode(size=6), _fail)


# -- the CPU decode stage ----------------------------------------------------------------------

def _jpeg(rng: np.random.Generator, height: int, width: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
        buf, format="JPEG", quality=85)
    return buf.getvalue()


def _ragged(items: list[bytes]) -> tuple[torch.Tensor, torch.Tensor]:
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in items])]).astype(np.int64)
    values = np.frombuffer(b"".join(items), dtype=np.uint8).copy()
    return torch.from_numpy(values), torch.from_numpy(offsets)


def _expected(jpg: bytes, u: np.ndarray, size: int, flip: bool) -> np.ndarray:
    """Pillow decode + the documented crop rule, written out with numpy."""
    with Image.open(io.BytesIO(jpg)) as im:
        hwc = np.asarray(im.convert("RGB"))
    top = int(u[0] * (hwc.shape[0] - size + 1))
    left = int(u[1] * (hwc.shape[1] - size + 1))
    crop = hwc[top : top + size, left : left + size]
    if flip and u[2] < 0.5:
        crop = crop[:, ::-1]
    return crop.transpose(2, 0, 1)


ROWS = np.array([[1, 10, 13], [0, 0, 2]], dtype=np.int64)  # 3 samples of shard 1, 2 of shard 0
SHARDS = ("a.tar", "b.tar")


@pytest.mark.parametrize("threads", [1, 3])
def test_stage_decodes_crops_and_flips_like_pillow(threads) -> None:
    rng = np.random.default_rng(1)
    jpgs = [_jpeg(rng, 20 + 3 * i, 30 - 2 * i) for i in range(5)]
    values, offsets = _ragged(jpgs)
    ids = torch.arange(5)
    dec = BatchDecoder(Decode({"jpg": ImageDecode(size=16, flip=True, output="image")},
                              threads=threads), None, SHARDS)
    try:
        tag = BatchTag(9, 2, 41)
        out = dec({"jpg": values, "jpg.offsets": offsets, "id": ids}, ROWS, tag)
        again = dec({"jpg": values, "jpg.offsets": offsets, "id": ids}, ROWS, tag)
        other = dec({"jpg": values, "jpg.offsets": offsets, "id": ids}, ROWS, BatchTag(9, 2, 42))
    finally:
        dec.close()
    assert set(out) == {"image", "id"} and out["id"] is ids
    assert out["image"].shape == (5, 3, 16, 16) and out["image"].dtype == torch.uint8
    u = draws(9, 2, 41, "jpg", 5)
    for i, jpg in enumerate(jpgs):
        assert np.array_equal(out["image"][i].numpy(), _expected(jpg, u[i], 16, True)), i
    assert torch.equal(out["image"], again["image"])
    assert not torch.equal(out["image"], other["image"])


def test_a_batch_decoded_ahead_is_the_batch_decoded_at_its_turn() -> None:
    rng = np.random.default_rng(3)
    batches = []
    for _ in range(3):
        values, offsets = _ragged([_jpeg(rng, 24, 20) for _ in range(5)])
        batches.append({"jpg": values, "jpg.offsets": offsets, "id": torch.arange(5)})
    tags = [BatchTag(4, 0, b) for b in range(3)]
    spec = Decode({"jpg": ImageDecode(size=16, flip=True)}, threads=2)
    inline, ahead = BatchDecoder(spec, None, SHARDS), BatchDecoder(spec, None, SHARDS)
    keys = [object() for _ in batches]
    try:
        want = [inline(b, ROWS, t) for b, t in zip(batches, tags, strict=True)]
        ahead.ahead(keys[0], batches[0], ROWS, tags[0])
        got = [ahead(batches[0], ROWS, tags[0], key=keys[0])]
        ahead.ahead(keys[1], batches[1], ROWS, tags[1])
        # The consumer took another batch than the one decoded ahead (a new pass): decoded now.
        got.append(ahead(batches[2], ROWS, tags[2], key=keys[2]))
        assert ahead.ahead_used == 1
        got.insert(1, ahead(batches[1], ROWS, tags[1], key=keys[1]))  # nothing ahead: now
        assert ahead.ahead_used == 1
    finally:
        inline.close()
        ahead.close()
    for w, g in zip(want, got, strict=True):
        assert torch.equal(w["jpg"], g["jpg"]) and torch.equal(w["id"], g["id"])


def test_the_error_of_a_batch_decoded_ahead_is_raised_at_its_turn_only() -> None:
    rng = np.random.default_rng(4)
    good = _ragged([_jpeg(rng, 12, 12) for _ in range(5)])
    bad = _ragged([_jpeg(rng, 12, 12) for _ in range(3)] + [b"not a jpeg", _jpeg(rng, 12, 12)])
    dec = _decoder()
    key, other = object(), object()
    try:
        dec.ahead(key, {"jpg": bad[0], "jpg.offsets": bad[1]}, ROWS, BatchTag(0, 1, 6))
        with pytest.raises(DecodeError, match="failed at sample 3 of batch 6 of epoch 1"):
            dec({"jpg": bad[0], "jpg.offsets": bad[1]}, ROWS, BatchTag(0, 1, 6), key=key)
        # Decoded ahead and never taken (another batch came first): its error is nobody's.
        dec.ahead(key, {"jpg": bad[0], "jpg.offsets": bad[1]}, ROWS, BatchTag(0, 1, 6))
        out = dec({"jpg": good[0], "jpg.offsets": good[1]}, ROWS, BatchTag(0, 1, 7), key=other)
        assert out["jpg"].shape == (5, 3, 8, 8)
        dec.ahead(key, {"jpg": good[0], "jpg.offsets": good[1]}, ROWS, BatchTag(0, 1, 7))
    finally:
        dec.close()  # waits for the decode ahead still pending
    dec.close()


def _decoder(**kw) -> BatchDecoder:
    return BatchDecoder(Decode({"jpg": ImageDecode(size=8, **kw)}, threads=2), None, SHARDS)


def test_stage_names_a_corrupt_sample_its_position_and_shard() -> None:
    rng = np.random.default_rng(2)
    jpgs = [_jpeg(rng, 12, 12) for _ in range(5)]
    jpgs[3] = b"not a jpeg at all"
    jpgs[4] = jpgs[4][: len(jpgs[4]) // 2]  # truncated: only the first failure is named
    values, offsets = _ragged(jpgs)
    dec = _decoder()
    try:
        with pytest.raises(DecodeError) as e:
            dec({"jpg": values, "jpg.offsets": offsets}, ROWS, BatchTag(0, 1, 6))
        assert str(e.value).startswith("decode of field 'jpg' failed at sample 3 of batch 6 "
                                       "of epoch 1 (a.tar, sample 0): UnidentifiedImageError: "
                                       "not an image Pillow reads (17 bytes, starting "
                                       "b'not a jp')")
        assert (e.value.field, e.value.position, e.value.shard, e.value.sample) == (
            "jpg", 3, "a.tar", 0)
        # A short batch (samples skipped as damaged on the server): no shard is named.
        short_v, short_o = _ragged(jpgs[2:4])
        with pytest.raises(DecodeError) as e:
            dec({"jpg": short_v, "jpg.offsets": short_o}, ROWS, BatchTag(0, 1, 6))
        assert "failed at sample 1 of batch 6 of epoch 1: " in str(e.value)
        assert e.value.shard is None
        small_v, small_o = _ragged([_jpeg(rng, 12, 12), _jpeg(rng, 6, 12)])
        with pytest.raises(DecodeError, match=r"sample 1 of batch 6 of epoch 1 \(b.tar, sample "
                                              r"11\): the image is 6x12 .* crop 8x8"):
            dec({"jpg": small_v, "jpg.offsets": small_o}, np.array([[1, 10, 12]]),
                BatchTag(0, 1, 6))
    finally:
        dec.close()


@pytest.mark.parametrize("batch, needle", [
    ({"id": torch.arange(2)}, "the batch has no such field (it has: id)"),
    ({"jpg": torch.zeros((2, 4), dtype=torch.uint8)},
     "not a bytes field: a fixed-size torch.uint8 field of shape (2, 4)"),
    ({"jpg": torch.zeros(4, dtype=torch.int64), "jpg.offsets": torch.tensor([0, 2, 4])},
     "not a bytes field: a variable-length torch.int64 field of shape (4,)"),
])
def test_stage_refuses_a_missing_or_non_bytes_field(batch, needle) -> None:
    dec = _decoder()
    try:
        with pytest.raises(DecodeError) as e:
            dec(batch, ROWS, BatchTag(0, 3, 2))
    finally:
        dec.close()
    assert str(e.value).startswith("decode of field 'jpg' in batch 2 of epoch 3: ")
    assert needle in str(e.value) and e.value.position is None


def test_stage_refuses_an_output_that_is_already_a_field() -> None:
    values, offsets = _ragged([_jpeg(np.random.default_rng(3), 8, 8)])
    dec = BatchDecoder(Decode({"jpg": ImageDecode(output="id")}), None, SHARDS)
    try:
        with pytest.raises(DecodeError, match="field 'jpg' in batch 0 of epoch 0: its "
                                              "`output` 'id' is already a field"):
            dec({"jpg": values, "jpg.offsets": offsets, "id": torch.arange(1)}, ROWS[:1, :],
                BatchTag())
    finally:
        dec.close()


def test_where_maps_positions_to_shards() -> None:
    where = Where(BatchTag(), ROWS, SHARDS)
    assert [where.sample(i, 5) for i in range(5)] == [
        ("b.tar", 10), ("b.tar", 11), ("b.tar", 12), ("a.tar", 0), ("a.tar", 1)]
    assert where.sample(0, 4) == (None, None)


def test_pillow_backend_reads_grayscale_as_rgb() -> None:
    buf = io.BytesIO()
    Image.fromarray(np.full((6, 7), 200, dtype=np.uint8)).save(buf, format="PNG")
    values, offsets = _ragged([buf.getvalue()])
    backend = PillowBackend(1)
    (image,) = backend.decode(values, offsets.tolist(), _fail)
    assert image.shape == (3, 6, 7) and image.eq(200).all()


class _PillowDecodeJpeg:
    """``torchvision.io.decode_jpeg``'s signature over Pillow, for the nvJPEG backend's own
    logic on the CPU (the split into views, the batched call, naming the failing sample), as
    the CUDA ring runs on the CPU with a copier of its own. Records what it was given."""

    def __init__(self) -> None:
        self.calls: list[list[torch.Tensor]] = []

    def __call__(self, data, mode, device):
        batch = data if isinstance(data, list) else [data]
        self.calls.append(batch)
        out = []
        for d in batch:
            try:
                with Image.open(io.BytesIO(d.numpy().tobytes())) as im:
                    out.append(torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1))
            except Exception as e:
                raise RuntimeError(f"decode failed: {e}") from e
        return out if isinstance(data, list) else out[0]


def test_nvjpeg_backend_passes_views_in_one_call_and_names_a_bad_sample() -> None:
    rng = np.random.default_rng(4)
    jpgs = [_jpeg(rng, 10 + i, 12) for i in range(4)]
    values, offsets = _ragged(jpgs)
    fake = _PillowDecodeJpeg()
    backend = NvjpegBackend(torch.device("cpu"), fake, "RGB")
    images = backend.decode(values, offsets.tolist(), _fail)
    assert [tuple(i.shape) for i in images] == [(3, 10 + i, 12) for i in range(4)]
    (call,) = fake.calls
    base = values.data_ptr()
    assert [t.data_ptr() - base for t in call] == offsets[:-1].tolist()  # views, no copies
    jpgs[2] = b"\xff\xd8 broken"
    values, offsets = _ragged(jpgs)
    with pytest.raises(DecodeError, match="sample 2: RuntimeError: decode failed"):
        backend.decode(values, offsets.tolist(), _fail)
    assert backend.decode(values[:0], [0], _fail) == []


def test_nvjpeg_backend_reports_a_batch_failure_no_single_image_repeats() -> None:
    def batch_only_fails(data, mode, device):
        if isinstance(data, list):
            raise RuntimeError("out of memory")
        return torch.zeros((3, 2, 2), dtype=torch.uint8)

    values, offsets = _ragged([_jpeg(np.random.default_rng(5), 8, 8)] * 2)
    backend = NvjpegBackend(torch.device("cpu"), batch_only_fails, "RGB")
    with pytest.raises(DecodeError, match="sample None: the batched decode failed, every image "
                                          "alone did not: RuntimeError: out of memory"):
        backend.decode(values, offsets.tolist(), _fail)
