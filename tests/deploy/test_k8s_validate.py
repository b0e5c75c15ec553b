"""Every overlay renders with `kubectl kustomize` and validates offline: built-in kinds with
`kubernetes-validate --strict` for two Kubernetes versions, the JobSet against its schema (and
each of its Job templates as a batch/v1 Job, strictly)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from manifests import CRD_KINDS, OVERLAYS, Doc, render, tool

# 1.33: the first release with native sidecars (init containers with restartPolicy Always) GA;
# 1.37: the newest schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.33.0", "1.37.0")
JOBSET_SCHEMA = Path(__file__).with_name("jobset_v1alpha2.schema.json")


def _is_crd(doc: Doc) -> bool:
    return (doc["apiVersion"], doc["kind"]) in CRD_KINDS


def _jobs_of(jobset: Doc) -> list[Doc]:
    """Each replicated Job template of a JobSet as the batch/v1 Job the controller creates."""
    meta = jobset["metadata"]
    return [{"apiVersion": "batch/v1", "kind": "Job",
             "metadata": {**rj["template"].get("metadata", {}),
                          "name": f"{meta['name']}-{rj['name']}-0",
                          "namespace": meta.get("namespace", "default")},
             "spec": rj["template"]["spec"]}
            for rj in jobset["spec"]["replicatedJobs"]]


def _validate(files: list[Path], version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("kubernetes-validate"), "--strict", "-k", version,
                           *map(str, files)], capture_output=True, text=True, timeout=120)


def _built_in(docs: list[Doc]) -> list[Doc]:
    """The documents of a render that Kubernetes' own schemas cover, the JobSet's Jobs too."""
    return ([d for d in docs if not _is_crd(d)]
            + [job for d in docs if d["kind"] == "JobSet" for job in _jobs_of(d)])


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_built_in_kinds_validate_strictly(version: str, tmp_path: Path) -> None:
    files = {}
    for overlay in OVERLAYS:
        files[overlay] = tmp_path / f"{overlay}.yaml"
        files[overlay].write_text(yaml.safe_dump_all(_built_in(render(overlay))))
    done = _validate(list(files.values()), version)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    # Nothing skipped for want of a schema (kubernetes-validate only warns about that).
    assert "WARN" not in out
    for overlay, path in files.items():
        passed = [line for line in out.splitlines() if f"{path} passed for resource " in line]
        assert len(passed) == len(_built_in(render(overlay))), out


def test_the_validator_rejects_an_unknown_field(tmp_path: Path) -> None:
    statefulset = next(d for d in render("disaggregated") if d["kind"] == "StatefulSet")
    statefulset["spec"]["template"]["spec"]["containers"][0]["probe"] = {}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(statefulset))
    done = _validate([path], K8S_VERSIONS[-1])
    assert done.returncode == 1
    assert "'probe' was unexpected" in done.stdout + done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_only_known_custom_resources(overlay: str) -> None:
    kinds = {(d["apiVersion"], d["kind"]) for d in render(overlay)}
    groups = {api.split("/")[0] for api, _ in kinds if "/" in api}
    assert groups <= {"apps", "batch", "policy", "networking.k8s.io", "jobset.x-k8s.io"}


def test_jobset_matches_its_schema_and_rules() -> None:
    jobset = next(d for d in render("jobset") if d["kind"] == "JobSet")
    jsonschema.validate(jobset, json.loads(JOBSET_SCHEMA.read_text()))
    spec = jobset["spec"]
    names = [rj["name"] for rj in spec["replicatedJobs"]]
    assert len(set(names)) == len(names)
    assert "dependsOn" not in spec["replicatedJobs"][0], "the first replicatedJob cannot wait"
    for i, rj in enumerate(spec["replicatedJobs"]):
        for dep in rj.get("dependsOn", []):
            assert dep["name"] in names[:i], f"{rj['name']} depends on a later or unknown job"
    assert not (spec.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder"
                and any("dependsOn" in rj for rj in spec["replicatedJobs"]))
    for policy in ("successPolicy", "failurePolicy"):
        assert set(spec.get(policy, {}).get("targetReplicatedJobs", [])) <= set(names)
    # The loaders end with the job: success is the trainers' alone, who wait for the loaders.
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["trainers"]}
    assert names == ["loaders", "trainers"]
    assert spec["replicatedJobs"][1]["dependsOn"] == [{"name": "loaders", "status": "Ready"}]


def test_the_schema_rejects_what_the_controller_would(tmp_path: Path) -> None:
    schema = json.loads(JOBSET_SCHEMA.read_text())
    jobset = next(d for d in render("jobset") if d["kind"] == "JobSet")
    jobset["spec"]["successPolicy"]["operator"] = "Some"
    with pytest.raises(jsonschema.ValidationError, match="'Some' is not one of"):
        jsonschema.validate(jobset, schema)
