"""Helpers for the deploy tests: render the kustomize overlays, walk pods and containers."""

from __future__ import annotations

import copy
import functools
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ("disaggregated", "sidecar", "jobset")
# Kinds outside Kubernetes' built-in schemas, checked against tests/deploy/*.schema.json.
CRD_KINDS = {("jobset.x-k8s.io/v1alpha2", "JobSet")}
LOADER_IMAGE = "dataflow-loader"

Doc = dict[str, Any]


def project_version() -> str:
    """The installed dataflow's version (pyproject's ``project.version``)."""
    return version("dataflow-loader")


def tool(name: str) -> str:
    """Path of a command-line tool: the venv's (beside this Python) first, then PATH; the
    test is skipped when it is missing."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.skip(f"`{name}` is not installed (pip install -e '.[dev]' installs it)")
    return found


def render(overlay: str) -> list[Doc]:
    """``kubectl kustomize deploy/k8s/overlays/OVERLAY``, parsed (a fresh copy per call: rendered
    once per session)."""
    return copy.deepcopy(_render(overlay))


@functools.cache
def _render(overlay: str) -> list[Doc]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed: cannot render the kustomize overlays")
    done = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def one(docs: list[Doc], kind: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def pod_templates(doc: Doc) -> Iterator[tuple[str, Doc]]:
    """``(where, pod template)`` for every pod template of a workload (JobSet included)."""
    name = f"{doc['kind']}/{doc['metadata']['name']}"
    if doc["kind"] in ("StatefulSet", "Deployment", "Job"):
        yield name, doc["spec"]["template"]
    elif doc["kind"] == "JobSet":
        for rj in doc["spec"]["replicatedJobs"]:
            yield f"{name}/{rj['name']}", rj["template"]["spec"]["template"]


def all_pods(docs: list[Doc]) -> list[tuple[str, Doc]]:
    return [p for d in docs for p in pod_templates(d)]


def containers(pod: Doc) -> list[Doc]:
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def is_loader(container: Doc) -> bool:
    return container["image"].split(":")[0].rsplit("/", 1)[-1] == LOADER_IMAGE


def loader_pods(docs: list[Doc]) -> list[tuple[str, Doc]]:
    return [(w, p) for w, p in all_pods(docs) if any(is_loader(c) for c in containers(p))]


def env(container: Doc, name: str) -> str | None:
    for e in container.get("env", []):
        if e["name"] == name:
            return e.get("value")
    return None


def flag(args: list[str], name: str) -> str | None:
    """The value after ``name`` in an argument list, or None."""
    return args[args.index(name) + 1] if name in args else None


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def mounted_file(pod: Doc, container: Doc, path: str) -> tuple[str, str] | None:
    """``(secret name, key)`` of the secret item a file path of ``container`` comes from."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for m in container.get("volumeMounts", []):
        prefix = m["mountPath"].rstrip("/") + "/"
        secret = volumes[m["name"]].get("secret")
        if path.startswith(prefix) and secret is not None:
            for item in secret.get("items", []):
                if item["path"] == path[len(prefix):]:
                    return secret["secretName"], item["key"]
    return None


def mount_source(pod: Doc, container: Doc, path: str) -> Doc | None:
    """The volume mounted at exactly ``path`` in ``container``, or None."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for m in container.get("volumeMounts", []):
        if m["mountPath"].rstrip("/") == path.rstrip("/"):
            return volumes[m["name"]]
    return None
