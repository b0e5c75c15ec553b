"""The commands README.md, docs/*.md and bench/RESULTS.md give name modules and transforms
(functions or ``Stages``) that exist."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from dataflow.transform import Stages

REPO = Path(__file__).resolve().parents[2]
DOCS = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")),
        "bench/RESULTS.md")
MODULE = re.compile(r"python -m (dataflow(?:\.\w+)*)")
TRANSFORM = re.compile(r"--transform (dataflow(?:\.\w+)+):(\w+)")


def _named(pattern: re.Pattern[str]) -> set[tuple[str, ...]]:
    """The groups of every match in the docs, but for placeholders (``dataflow.bench.NAME``)."""
    found: set[tuple[str, ...]] = set()
    for doc in DOCS:
        found.update(m.groups() for m in pattern.finditer((REPO / doc).read_text()))
    return {groups for groups in found if groups[0].islower()}


def test_the_docs_name_the_bench_and_its_experiments() -> None:
    modules = {name for (name,) in _named(MODULE)}
    assert "dataflow.bench" in modules
    assert "dataflow.bench.experiments.trainer_cpu" in modules


@pytest.mark.parametrize("name", sorted(name for (name,) in _named(MODULE)))
def test_every_python_m_command_names_a_runnable_module(name: str) -> None:
    spec = importlib.util.find_spec(name)
    assert spec is not None, f"`python -m {name}`: no such module"
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        assert importlib.util.find_spec(f"{name}.__main__") is not None, name


@pytest.mark.parametrize("module,func", sorted(_named(TRANSFORM)))
def test_every_transform_named_is_a_callable_or_stages(module: str, func: str) -> None:
    found = getattr(importlib.import_module(module), func, None)
    assert callable(found) or isinstance(found, Stages), f"{module}:{func}"
