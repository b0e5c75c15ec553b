"""The JPEG decode workload: shards written by webdataset, decoded the same way on both sides."""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from dataflow.bench.experiments.jpeg import (
    CROP,
    SIDE,
    _crop,
    crop_sample,
    decode,
    decode_crop,
    parse_size,
    stack_samples,
    write_shards,
)
from dataflow.bench.experiments.trainer_cpu import thread_cpu
from dataflow.readers import open_shard


@pytest.mark.timeout(60)
def test_server_transform_and_torch_side_decode_the_same_shards(tmp_path):
    paths = write_shards(str(tmp_path), shards=2, per_shard=3)
    assert write_shards(str(tmp_path), shards=2, per_shard=3) == paths  # reused
    with open_shard(paths[1]) as reader:
        batch = reader.read(0, 3)
    out = decode_crop(batch)
    assert set(out) == {"image", "id"}
    assert out["image"].shape == (3, CROP, CROP, 3) and out["image"].dtype == np.uint8
    assert out["id"].tolist() == [3, 4, 5]
    samples = [crop_sample(s) for s in wds.DataPipeline(wds.SimpleShardList(paths),
                                                        wds.tarfile_to_samples())]
    stacked = stack_samples(samples)
    assert stacked["id"].tolist() == list(range(6))
    assert stacked["image"].shape == (6, CROP, CROP, 3)
    # the crops differ, the pictures do not: both sides decode to the same mean colour
    assert abs(float(stacked["image"][3:].mean()) - float(out["image"].mean())) < 8


def test_decode_crop_names_a_field_of_the_wrong_kind():
    with pytest.raises(TypeError, match="field 'jpg' must be bytes"):
        decode_crop({"jpg": np.zeros(3, np.uint8), "id": np.arange(3)})
    with pytest.raises(TypeError, match="'jpg' and 'id' must be raw bytes"):
        crop_sample({"__key__": "k", "jpg": "text", "id": b"1"})


def test_thread_cpu_names_python_threads():
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin, name="bench-spinner")
    t.start()
    try:
        stop.wait(0.3)
        seen = thread_cpu()
    finally:
        stop.set()
        t.join()
    assert "bench-spinner" in seen and "MainThread" in seen


@pytest.mark.timeout(60)
def test_larger_images_are_resized_and_center_cropped_as_imagenet_training_does(tmp_path):
    paths = write_shards(str(tmp_path), shards=1, per_shard=2, size=(300, 270))
    with open_shard(paths[0]) as reader:
        batch = reader.read(0, 2)
    jpg = batch["jpg"]
    data = jpg.values[jpg.offsets[0]:jpg.offsets[1]].tobytes()
    with Image.open(io.BytesIO(data)) as im:
        assert im.size == (300, 270)
        rgb = im.convert("RGB")
    # shorter side 270 -> 256: 284 x 256, then the middle 256 columns
    expected = np.asarray(rgb.resize((284, 256), Image.Resampling.BILINEAR))[:, 14:270]
    pixels = decode(batch)["pixels"]
    assert pixels.shape == (2, SIDE, SIDE, 3)
    assert np.array_equal(pixels[0], expected)
    # the random crop of either path is a window of those pixels, drawn from the rng
    rng, again = np.random.default_rng(3), np.random.default_rng(3)
    x, y = int(again.integers(0, SIDE - CROP + 1)), int(again.integers(0, SIDE - CROP + 1))
    assert crop_sample({"jpg": data, "id": b"0"})["image"].shape == (CROP, CROP, 3)
    assert decode_crop({"jpg": jpg, "id": batch["id"]})["image"].shape == (2, CROP, CROP, 3)
    assert np.array_equal(_crop(data, rng), expected[y:y + CROP, x:x + CROP])


@pytest.mark.parametrize("text", ["500", "500x", "ax375", "255x300", "500x375x3"])
def test_an_image_size_is_width_x_height_of_at_least_the_decoded_side(text):
    with pytest.raises(ValueError, match="image size"):
        parse_size(text)
    assert parse_size("500X375") == (500, 375)
