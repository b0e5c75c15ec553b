"""Every code block of README.md and docs/*.md runs or is checked, and every link resolves.

- ```python blocks run, against two real local servers of demo shards (and, for the block that
  names one, a server of JPEG tars), in a fresh working directory: the blocks of a page in order,
  each in a namespace of its own unless marked to continue the one before. The endpoints the
  docs give (``tcp://loader-0:5555``) are replaced by the local servers' through
  :data:`SUBSTITUTE`; names that stand for the reader's own code come from :data:`PROVIDED`.
- Shell blocks: every ``python -m dataflow...``, ``dataflow-server``, ``dataflow-bench`` and
  ``python examples/X.py`` command line is parsed by that program's own argparse parser, and
  every ``make`` target exists in the Makefile. Other programs (docker, kubectl, ...) are named
  in :data:`OTHER_PROGRAMS`; a command of a program in neither fails the test.
- ``text`` blocks are shown output and diagrams; a block of another language (yaml, json...)
  fails until a check for it is added here.

A block that cannot run here is marked in the doc, on the line before it, with
``<!-- doc-test: skip (REASON) -->``; ``<!-- doc-test: continue -->`` runs a python block in the
namespace the page's previous python block left; ``<!-- doc-test: twice (REASON) -->`` runs it a
second time, in a fresh namespace in the same directory (a checkpoint the first run wrote).
A block with no language, an unknown marker or a skip without a reason fails.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import linecache
import os
import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

from dataflow.client import DataLoader, MixtureLoader
from dataflow.demo import DemoSpec, make_demo
from dataflow.security import generate_keys
from dataflow.server import ServerHandle, launch

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```$", re.M | re.S)
MARKER = re.compile(r"<!-- doc-test: (.*?) -->\s*\Z")
SHELL = {"sh", "bash", "console"}
FRONT_PAGE_LINES = 130  # "fits on two screens"

# Placeholders a reader replaces with their own, and what the test puts there. Keep it small:
# each entry is a name the docs cannot know (the reader's hosts) or a device CI lacks.
SUBSTITUTE: dict[str, Callable[[LocalServers], str]] = {
    # the front page's trainer reads a job's servers: the two local ones
    "tcp://loader-0:5555": lambda s: s.demo[0].endpoint,
    "tcp://loader-1:5555": lambda s: s.demo[1].endpoint,
    # the mixture example's three datasets: all three are the local demo data
    "tcp://web-loader:5555": lambda s: s.demo[0].endpoint,
    "tcp://code-loader:5555": lambda s: s.demo[1].endpoint,
    "tcp://books-loader:5555": lambda s: s.demo[0].endpoint,
    # the CURVE example: a server started with the keys the page's keygen commands make in the
    # working directory, and the place the page moves the trainer's secret key to
    "tcp://secure-loader:5555": lambda s: s.curve().endpoint,
    "/secure/place/": lambda s: f"{s.root / 'secure-place'}/",
    # the trainer decode example needs JPEG bytes: a server of JPEG tars
    "tcp://jpeg-loader:5555": lambda s: s.jpeg().endpoint,
    # a Kubernetes Service's DNS name: localhost resolves here, to the first server's port
    "dns+tcp://loader.train.svc.cluster.local:5555":
        lambda s: "dns+tcp://localhost:" + s.demo[0].endpoint.rsplit(":", 1)[1],
    # CI has no GPU: the examples that name "cuda" run on the CPU there (as they are on a GPU)
    'device="cuda"': lambda s: 'device="cuda"' if torch.cuda.is_available() else "device=None",
}


def _train_step(batch: dict) -> float:
    """The reader's training step in the lineage example: the batch's loss (here one above the
    example's threshold, so the branch that asks for the lineage runs)."""
    assert batch["lineage.row"].dtype == torch.int64
    return 1e9


# Names the docs use for the reader's own code, defined for the blocks that use them.
PROVIDED: dict[str, object] = {"train_step": _train_step}

# Programs whose command lines the docs give but this test does not parse: each needs what CI
# has not (a container engine, a cluster, a scheduler) or is the shell's own.
OTHER_PROGRAMS = {"docker", "podman", "kubectl", "sbatch", "cd", "mv"}


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page, the line of its opening fence, language, text, marker."""

    page: Path
    line: int
    lang: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = MARKER.search(text[:m.start()])
        found.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                           before.group(1) if before else None))
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def _marker(block: Block) -> tuple[str, str | None]:
    """``(kind, reason)`` of a block's marker: ``run`` when it has none."""
    if block.marker is None:
        return "run", None
    m = re.fullmatch(r"(skip|twice) \((.+)\)|(continue)", block.marker)
    assert m, f"{block.where}: unknown doc-test marker {block.marker!r}"
    return (m.group(1), m.group(2)) if m.group(1) else ("continue", None)


# ---- the servers the python blocks read -----------------------------------------------------

class LocalServers:
    """Two servers of small demo tar shards (a 3x64x64 uint8 ``image``, ``label``, ``id``,
    ``text`` per sample, as the docs' examples read), and a server of JPEG tars started the
    first time a block asks for it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        demo = make_demo(str(root / "demo"), DemoSpec(fmt="tar", shards=2, samples_per_shard=64),
                         progress=None)
        self.handles: list[ServerHandle] = []
        self.paths = [str(p) for p in demo.paths]
        self.demo = [self._start(self.paths) for _ in range(2)]
        self._jpeg: ServerHandle | None = None
        self._curve: ServerHandle | None = None

    def _start(self, data: list[str], extra_args: tuple[str, ...] = ()) -> ServerHandle:
        handle = launch(data, workers=1, extra_args=extra_args)
        self.handles.append(handle)
        return handle

    def curve(self) -> ServerHandle:
        """A server of the demo data that requires CURVE keys, made as docs/security.md's
        commands make them: ``keys/server`` and ``keys/allowed`` in the working directory, the
        trainer's secret key then moved out of the allowed directory."""
        if self._curve is None:
            generate_keys("keys/server", "server")
            generate_keys("keys/allowed", "trainer0")
            place = self.root / "secure-place"
            place.mkdir()
            os.replace("keys/allowed/trainer0.key_secret", place / "trainer0.key_secret")
            self._curve = self._start(self.paths, (
                "--curve-secret-key", os.path.abspath("keys/server/server.key_secret"),
                "--curve-allowed-keys", os.path.abspath("keys/allowed")))
        return self._curve

    def jpeg(self) -> ServerHandle:
        """A server of 256 JPEGs of 232x240 in 2 tars (a batch of the decode example)."""
        if self._jpeg is None:
            import webdataset
            from PIL import Image

            rng = np.random.default_rng(0)
            paths = []
            for s in range(2):
                paths.append(str(self.root / f"jpeg-{s}.tar"))
                with webdataset.TarWriter(paths[-1]) as w:
                    for i in range(128):
                        buf = io.BytesIO()
                        pixels = rng.integers(0, 256, (232, 240, 3), dtype=np.uint8)
                        Image.fromarray(pixels).save(buf, format="JPEG", quality=80)
                        w.write({"__key__": f"{s}-{i:04d}", "jpg": buf.getvalue(), "cls": i})
            self._jpeg = self._start(paths)
        return self._jpeg

    def close(self) -> None:
        for handle in self.handles:
            handle.close(grace=5)


@pytest.fixture(scope="module")
def local_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServers]:
    made = LocalServers(tmp_path_factory.mktemp("docs-servers"))
    try:
        yield made
    finally:
        made.close()


def _substituted(code: str, servers: LocalServers) -> str:
    for placeholder, value in SUBSTITUTE.items():
        if placeholder in code:
            code = code.replace(placeholder, value(servers))
    return code


def _fresh() -> dict:
    return {"__name__": "__doc_block__", **PROVIDED}


def _run(block: Block, namespace: dict, servers: LocalServers, opened: list) -> None:
    code = _substituted(block.code, servers)
    linecache.cache[block.where] = (len(code), None, code.splitlines(True), block.where)
    exec(compile(code, block.where, "exec"), namespace)
    opened.extend(v for v in namespace.values()
                  if isinstance(v, (DataLoader, MixtureLoader)) and v not in opened)


def _trainer_resumed(runs: list[dict]) -> None:
    """The front page's loop: the first run trains 10 epochs and checkpoints; the second
    resumes in the last epoch from that checkpoint and reads only the rest of it."""
    first, second = runs
    assert first["start"] == 0 and first["epoch"] == second["epoch"] == 9
    assert second["start"] == 9 and second["step"] < first["step"]


def _lineage_logged(runs: list[dict]) -> None:
    *_, lineage = runs
    origins = lineage["loader"].lineage(lineage["batch"])
    assert {o.source for o in origins} <= {"web", "code", "books"} and len(origins) > 0


# What the blocks of a page must leave behind, beyond running without an error.
LEFT_BEHIND: dict[str, Callable[[list[dict]], None]] = {
    "README.md": _trainer_resumed,
    "mixtures.md": _lineage_logged,
}
PYTHON_PAGES = sorted({b.page for b in ALL if b.lang == "python"})


@pytest.mark.timeout(120)
@pytest.mark.parametrize("page", PYTHON_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_python_blocks_run(page: Path, local_servers: LocalServers, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    opened: list = []
    runs: list[dict] = []  # the namespace each run left
    try:
        for block in (b for b in blocks(page) if b.lang == "python"):
            kind, _ = _marker(block)
            if kind == "skip":
                continue
            if kind == "continue":
                assert runs, f"{block.where}: `continue` with no python block run before it"
                namespaces = [runs[-1]]  # the same dict: the page's previous block goes on
            else:
                namespaces = [_fresh() for _ in range(2 if kind == "twice" else 1)]
            for namespace in namespaces:
                _run(block, namespace, local_servers, opened)
                runs.append(namespace)
        if page.name in LEFT_BEHIND:
            LEFT_BEHIND[page.name](runs)
    finally:
        for loader in opened:
            loader.close()
    if not runs:
        pytest.skip("every python block of the page is marked skip, with its reason")


# ---- shell blocks -----------------------------------------------------------------------------

def _makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([\w.-]+):(?!=)", text, re.M)}


def _example_parser(script: str) -> argparse.ArgumentParser:
    spec = importlib.util.spec_from_file_location(Path(script).stem, REPO / script)
    assert spec is not None and spec.loader is not None, f"{script}: no such file"
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


def _server_parser(args: list[str]) -> tuple[argparse.ArgumentParser, list[str]]:
    from dataflow.server import container, flags, health

    if args[:1] == ["health"]:
        return health.build_parser(), args[1:]
    if args[:1] == ["container"]:
        return container.build_parser(), args[1:]
    return flags.build_parser(), args


def _parser_of(words: list[str]) -> tuple[argparse.ArgumentParser, list[str]] | None:
    """The parser of a command line and the arguments it parses; None for OTHER_PROGRAMS."""
    program, args = words[0], words[1:]
    if program == "dataflow-server":
        return _server_parser(args)
    if program == "dataflow-bench":
        from dataflow.bench.__main__ import build_parser

        return build_parser(), args
    if program == "python" or program.endswith("/python"):
        if args[0] != "-m":
            return _example_parser(args[0]), args[1:]
        module, args = args[1], args[2:]
        if module == "dataflow":
            from dataflow.__main__ import _parser

            return _parser(), args
        if module == "dataflow.server":
            return _server_parser(args)
        if module == "dataflow.bench":
            from dataflow.bench.__main__ import build_parser

            return build_parser(), args
        raise AssertionError(f"`python -m {module}`: no parser known to this test")
    assert program in OTHER_PROGRAMS, f"`{program}`: a program this test does not know"
    return None


def commands(code: str) -> list[list[str]]:
    """The command lines of a shell block: continuations joined, comments dropped, split at
    ``&&``, ``||``, ``;`` and ``|``."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words: list[str] = []
        for word in shlex.split(line, comments=True) + [";"]:
            if word in ("&&", "||", ";", "|"):
                if words:
                    found.append(words)
                words = []
            else:
                words.append(word)
    return found


SHELL_BLOCKS = [b for b in ALL if b.lang in SHELL]


@pytest.mark.parametrize("block", SHELL_BLOCKS, ids=lambda b: b.where)
def test_shell_commands_parse(block: Block) -> None:
    kind, _ = _marker(block)
    if kind == "skip":
        pytest.skip(f"{block.where}: {block.marker}")
    targets = _makefile_targets()
    for words in commands(block.code):
        if words[0] == "make":
            named = [w for w in words[1:] if "=" not in w]
            assert named and set(named) <= targets, f"{block.where}: `{' '.join(words)}`"
            continue
        found = _parser_of(words)
        if found is None:
            continue
        parser, args = found
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                parser.parse_args(args)
            except SystemExit:
                pytest.fail(f"{block.where}: `{' '.join(words)}`: {err.getvalue().strip()}")


# ---- every block is covered, data blocks parse, links resolve -----------------------------------

@pytest.mark.parametrize("block", ALL, ids=lambda b: b.where)
def test_every_block_has_a_language_and_a_valid_marker(block: Block) -> None:
    assert block.lang in {"python", "text"} | SHELL, (
        f"{block.where}: a code block needs a language this test runs or parses, found "
        f"{block.lang!r}")
    kind, reason = _marker(block)
    assert kind in ("run", "twice") or block.lang == "python" or kind == "skip", (
        f"{block.where}: `{kind}` is for python blocks")
    assert kind != "skip" or reason, f"{block.where}: a skip says why"


def test_every_substitution_and_provided_name_is_used() -> None:
    code = "\n".join(b.code for b in ALL if b.lang == "python")
    assert [p for p in SUBSTITUTE if p not in code] == []
    assert [n for n in PROVIDED if not re.search(rf"\b{n}\b", code)] == []


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but ``-`` and ``_`` dropped,
    spaces as ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_links_and_anchors_resolve(page: Path) -> None:
    text = re.sub(r"`[^`\n]*`(?!\])", "", FENCE.sub("", page.read_text()))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(REPO)})")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(REPO)})")
    assert broken == [], f"{page.relative_to(REPO)}: {broken}"


def test_the_front_page_fits_on_two_screens_and_links_every_docs_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= FRONT_PAGE_LINES
    assert "\n## Two commands\n" in text and "make demo" in text and "make test" in text
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", text))
    assert linked == {p.name for p in PAGES[1:]}
