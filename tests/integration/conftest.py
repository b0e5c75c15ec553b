"""Integration fixtures: demo datasets, real server processes, raw protocol clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from srvtools import RawClient

from dataflow.demo import DemoResult, DemoSpec, make_demo
from dataflow.server import ServerHandle, launch

SMALL_IMAGE = (3, 8, 8)


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], DemoResult]:
    """``demo_data(fmt)``: an uneven 7-shard demo dataset of that format (cached per session)."""
    made: dict[str, DemoResult] = {}

    def get(fmt: str) -> DemoResult:
        if fmt not in made:
            out = tmp_path_factory.mktemp(f"demo-{fmt}")
            made[fmt] = make_demo(str(out), DemoSpec(fmt=fmt, shards=7, samples_per_shard=60,
                                                     image_shape=SMALL_IMAGE), progress=None)
        return made[fmt]

    return get


@pytest.fixture
def servers() -> Iterator[Callable[..., ServerHandle]]:
    """``servers(data, **launch_kwargs)`` starts a server; all are stopped at teardown."""
    started: list[ServerHandle] = []

    def start(data: list[str], **kwargs) -> ServerHandle:
        kwargs.setdefault("workers", 1)
        handle = launch(data, **kwargs)
        started.append(handle)
        return handle

    try:
        yield start
    finally:
        for h in started:
            h.close(grace=5)


@pytest.fixture
def raw_client() -> Iterator[Callable[[str], RawClient]]:
    """``raw_client(endpoint)``: a RawClient closed at teardown."""
    made: list[RawClient] = []

    def make(endpoint: str) -> RawClient:
        c = RawClient(endpoint)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.close()
