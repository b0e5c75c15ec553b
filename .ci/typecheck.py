"""Type-check the package as it is installed, not as the repository lays it out.

pyproject.toml maps repository folders into one namespace (``server/`` is ``dataflow.server``,
and so on). mypy does not follow the editable install's import hook, so run on the repository
folders it cannot resolve ``dataflow.server`` and loses every type that crosses that line.
This script stages ``build/typecheck/pkgs/dataflow`` as the installed tree, made of symlinks to
the repository's files (the layout comes from pyproject's ``[tool.setuptools.package-dir]``),
runs ``mypy -p dataflow`` there with pyproject's ``[tool.mypy]`` and prints mypy's findings
with repository paths (``server/x.py``, not ``dataflow/server/x.py``). Its exit status is
mypy's.

Usage: .venv/bin/python .ci/typecheck.py [extra mypy arguments]
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib  # a dependency of mypy itself on Python 3.10

REPO = Path(__file__).resolve().parents[1]
STAGE = REPO / "build" / "typecheck"
SKIP = {"__pycache__"}


def package_dirs(pyproject: Path) -> dict[str, Path]:
    """Package name -> repository folder, from ``[tool.setuptools.package-dir]``."""
    with pyproject.open("rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: REPO / folder for name, folder in mapping.items()}


def stage(dirs: dict[str, Path]) -> list[str]:
    """Rebuild the staged tree; returns the top-level package names.

    A package with mapped subpackages becomes a real folder holding a link to each of its
    entries plus a link per mapped subpackage; any other mapped package is one folder link.
    """
    shutil.rmtree(STAGE / "pkgs", ignore_errors=True)
    for name in sorted(dirs, key=lambda n: n.count(".")):
        target = STAGE / "pkgs" / name.replace(".", "/")
        children = {n.rpartition(".")[2] for n in dirs if n.rpartition(".")[0] == name}
        if not target.parent.resolve().is_relative_to(STAGE.resolve()):
            raise SystemExit(f"package-dir maps {name} inside a package that is not mapped "
                             "itself; this script cannot stage that layout")
        if not children:
            target.symlink_to(dirs[name], target_is_directory=True)
            continue
        target.mkdir(parents=True)
        for entry in dirs[name].iterdir():
            if entry.name not in SKIP and entry.name not in children:
                (target / entry.name).symlink_to(entry)
    return sorted(n for n in dirs if "." not in n)


def repo_paths(line: str, dirs: dict[str, Path]) -> str:
    """Rewrite a staged path at the start of a mypy line to its repository path."""
    for name in sorted(dirs, key=len, reverse=True):
        prefix = name.replace(".", "/") + "/"
        if line.startswith(prefix):
            return str(dirs[name].relative_to(REPO)) + "/" + line[len(prefix):]
    return line


def main(argv: list[str]) -> int:
    dirs = package_dirs(REPO / "pyproject.toml")
    tops = stage(dirs)
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml"),
           "--cache-dir", str(STAGE / "mypy-cache"), *argv]
    for top in tops:
        cmd += ["-p", top]
    done = subprocess.run(cmd, cwd=STAGE / "pkgs", capture_output=True, text=True)
    for line in done.stdout.splitlines():
        print(repo_paths(line, dirs))
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
