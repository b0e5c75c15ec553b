"""The reader's side of same-host shared memory when a segment cannot take a reply
(:meth:`~dataflow.server.shmserve.Segments.place`): the reply goes in TCP frames, and only a
segment that is there but unusable is worth a warning (a client that closed its segment with
requests in flight, as every loader does at its end, is not news)."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from dataflow import wire
from dataflow.server.shmserve import Segments
from dataflow.shm import Geometry, Segment
from dataflow.wire.internal import Task

GEO = Geometry(2, 1 << 16)


def _place(segments: Segments, name: str) -> wire.BatchMsg:
    task = Task(b"tok", 7, np.array([[0, 0, 4]]), shm=wire.ShmOffer(name, GEO.slots,
                                                                   GEO.slot_bytes), slot=0)
    msg = wire.batch_to_message(7, {"x": np.arange(4, dtype=np.int64)})
    return segments.place(task, msg)


@pytest.mark.parametrize("how", ["removed", "readable by others"])
def test_a_segment_that_cannot_take_a_reply_sends_it_in_frames(
        tmp_path, caplog: pytest.LogCaptureFixture, how: str) -> None:
    segment = Segment(GEO, directory=str(tmp_path))
    segments = Segments(directory=str(tmp_path))
    try:
        if how == "removed":
            os.unlink(segment.path)
        else:
            os.chmod(segment.path, 0o644)
        with caplog.at_level(logging.DEBUG, logger="dataflow.server"):
            msg = _place(segments, segment.name)
        assert msg.shm is None and len(msg.data) == 1  # frames
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        if how == "removed":
            assert not warned
            assert any("removed its shared-memory segment" in r.getMessage()
                       for r in caplog.records)
        else:
            assert len(warned) == 1 and "readable or writable by others" in warned[0].getMessage()
    finally:
        segments.close()
        segment.close()
