"""The JPEG decode workload: shards written by webdataset, decoded the same way on both sides."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import webdataset as wds

from dataflow.bench.experiments.jpeg import (
    CROP,
    crop_sample,
    decode_crop,
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
