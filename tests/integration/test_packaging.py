"""One import namespace: the wheel holds `dataflow` only, and a user's own `server.py`,
`client.py` or `dataflow.py` never stands in for ours."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from dataflow.exporter import DISTRIBUTION
from dataflow.server import launch

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "README.md", "dataflow", "server", "client", "bench")
IMPOSTOR = "raise SystemExit('the user\\'s own {name} was imported')\n"


def _impostors(where: Path) -> None:
    for name in ("server.py", "client.py", "bench.py", "dataflow.py"):
        (where / name).write_text(IMPOSTOR.format(name=name))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, timeout=120)
    (built,) = out.glob("*.whl")
    return built


@pytest.mark.timeout(150)
def test_wheel_holds_only_the_dataflow_package(wheel: Path) -> None:
    # The distribution is dataflow-loader (PyPI's `dataflow` is another project); the package
    # it installs is `dataflow`.
    assert wheel.name.startswith("dataflow_loader-"), wheel.name
    name = re.search(r'^name = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)
    assert name is not None and name.group(1) == DISTRIBUTION
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/", 1)[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"dataflow"}
    for module in ("dataflow/server/__main__.py", "dataflow/client/loader.py",
                   "dataflow/bench/__main__.py", "dataflow/bench/experiments/transport.py",
                   "dataflow/readers/tar/reader.py"):
        assert module in names
    # Every package of the source tree, however deep, is in the wheel (pyproject lists each).
    for folder, package in (("dataflow", "dataflow"), ("server", "dataflow/server"),
                            ("client", "dataflow/client"), ("bench", "dataflow/bench")):
        for init in (REPO / folder).rglob("__init__.py"):
            assert f"{package}/{init.relative_to(REPO / folder).as_posix()}" in names, init


@pytest.mark.timeout(150)
def test_wheel_install_runs_from_a_directory_of_impostors(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    str(site), str(wheel)], check=True, timeout=120)
    work = tmp_path / "work"
    work.mkdir()
    _impostors(work)
    probe = ("import sys; sys.path[0:1] = [sys.argv[1]]; import dataflow.server.__main__ as m, "
             "dataflow.client as c; print(m.__file__); print(c.__file__)")
    done = subprocess.run([sys.executable, "-c", probe, str(site)], cwd=work,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert all(line.startswith(str(site)) for line in done.stdout.split()), done.stdout


@pytest.mark.timeout(60)
def test_module_help_from_a_directory_holding_server_py(tmp_path: Path) -> None:
    _impostors(tmp_path)
    (tmp_path / "dataflow.py").unlink()  # `-m` puts the working directory first, by design
    for module in ("dataflow.server", "dataflow.bench"):
        done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=50)
        assert done.returncode == 0, done.stderr
        assert "usage:" in done.stdout


@pytest.mark.timeout(90)
def test_launch_starts_our_server_whatever_the_working_directory_holds(
        tmp_path: Path, demo_data, monkeypatch: pytest.MonkeyPatch) -> None:
    demo = demo_data("arrow")
    _impostors(tmp_path)
    monkeypatch.chdir(tmp_path)
    with launch([str(p) for p in demo.paths], workers=1) as server:
        assert server.ready["samples"] == demo.total


@pytest.mark.timeout(60)
def test_protocol_and_client_do_not_load_pyarrow_and_server_not_torch() -> None:
    probe = ("import sys, json; import dataflow.wire, dataflow.client; a = 'pyarrow' in "
             "sys.modules; import dataflow.server.__main__; "
             "print(json.dumps([a, 'torch' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [False, True]
    server_only = ("import sys; import dataflow.server.__main__, dataflow.index.scan; "
                   "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", server_only], capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
