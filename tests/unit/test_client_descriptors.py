"""The trainer's open-file limit raised before a loader's connections need it
(:mod:`dataflow.client.descriptors`)."""

from __future__ import annotations

import itertools

import pytest

from dataflow.client.descriptors import LINK_DESCRIPTORS, SPARE_DESCRIPTORS, soft_limit_for
from dataflow.errors import ConfigError


@pytest.mark.parametrize(("open_now", "links", "soft", "hard"), list(itertools.product(
    (3, 100, 1000), (1, 16, 256), (None, 64, 1024), (None, 1024, 4096))))
def test_soft_limit_over_a_grid(open_now: int, links: int, soft: int | None,
                                hard: int | None) -> None:
    if soft is not None and hard is not None and soft > hard:
        return
    needed = open_now + LINK_DESCRIPTORS * links + SPARE_DESCRIPTORS
    if soft is None or needed <= soft:
        assert soft_limit_for(open_now, links, soft, hard) is None
    elif hard is not None and needed > hard:
        with pytest.raises(ConfigError, match=rf"open-file hard limit \(ulimit -Hn\) {hard}"):
            soft_limit_for(open_now, links, soft, hard)
    else:
        assert soft_limit_for(open_now, links, soft, hard) == needed
