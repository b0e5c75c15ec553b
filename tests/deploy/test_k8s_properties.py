"""Properties of the rendered overlays: probes, restricted pods, pinned images, discovery that
names the real Service and port, declared metrics, a NetworkPolicy admitting trainers only."""

from __future__ import annotations

import pytest
from manifests import (
    OVERLAYS,
    all_pods,
    containers,
    env,
    flag,
    is_loader,
    loader_pods,
    matches,
    mount_source,
    mounted_file,
    one,
    port_of,
    project_version,
    render,
)

from dataflow.server.container import build_parser as container_parser

PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _loaders(overlay: str) -> list[tuple[str, dict, dict]]:
    found = [(w, pod, c) for w, pod in loader_pods(render(overlay)) for c in containers(pod)
             if is_loader(c)]
    assert found, f"{overlay}: no loader container"
    return found


def _trainers(overlay: str) -> list[tuple[str, dict, dict]]:
    found = [(w, pod, c) for w, pod in all_pods(render(overlay)) for c in containers(pod)
             if env(c, "DATAFLOW_SERVERS") is not None]
    assert found, f"{overlay}: no container with DATAFLOW_SERVERS"
    return found


def _server_args(container: dict) -> list[str]:
    """The loader's arguments with Kubernetes' $(VAR) expansion done."""
    values = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    args = []
    for arg in container["args"]:
        for name, value in values.items():
            arg = arg.replace(f"$({name})", value)
        args.append(arg)
    return args


def _data_ports(container: dict) -> list[int]:
    """The readers' data ports of a loader (``--data-ports`` and ``--workers``)."""
    args = container["args"]
    first, workers = flag(args, "--data-ports"), flag(args, "--workers")
    assert first is not None and workers is not None, "fixed data ports, a fixed reader count"
    return [int(first) + i for i in range(int(workers))]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_loader_arguments_parse(overlay: str) -> None:
    for where, _, c in _loaders(overlay):
        assert "command" not in c, f"{where}: the image's ENTRYPOINT is dataflow-server container"
        ns = container_parser().parse_args(_server_args(c))
        # Each loader spells out its ports (the image's defaults too): they must match below.
        assert {"--bind", "--data-ports", "--metrics-port", "--metrics-bind"} <= set(c["args"])
        assert ns.data_ports is not None and ns.metrics_port is not None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_loader_is_probed_at_healthz_on_its_metrics_port(overlay: str) -> None:
    for where, pod, c in _loaders(overlay):
        args = c["args"]
        declared = {p["name"]: p["containerPort"] for p in c["ports"]}
        for name in PROBES:
            probe = c[name]["httpGet"]
            assert probe["path"] == "/healthz", f"{where} {name}"
            assert declared[probe["port"]] == int(flag(args, "--metrics-port")), f"{where} {name}"
            assert c[name]["timeoutSeconds"] >= 1, f"{where} {name}"
        # The kubelet asks the pod's address, not its loopback.
        assert flag(args, "--metrics-bind") == "0.0.0.0", where
        if flag(args, "--curve-secret-key") is not None:
            assert mounted_file(pod, c, flag(args, "--curve-secret-key")) == (
                "dataflow-curve", "server.key_secret")
            allowed = flag(args, "--curve-allowed-keys")
            assert mounted_file(pod, c, f"{allowed}/trainer.key") == ("dataflow-curve",
                                                                      "trainer.key")
        # No probe key pair any more: nothing else of the Secret is mounted.
        mounted = [item["key"] for v in pod["spec"].get("volumes", []) if "secret" in v
                   for item in v["secret"].get("items", [])]
        assert not [k for k in mounted if k.startswith("probe.")], f"{where}: {mounted}"
        assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 600


@pytest.mark.parametrize("overlay", ["disaggregated", "jobset"])
def test_every_reader_data_port_is_declared(overlay: str) -> None:
    """Loaders other pods reach (the sidecar's listen on its pod's loopback only)."""
    for where, _, c in _loaders(overlay):
        declared = {p["name"]: p["containerPort"] for p in c["ports"]}
        readers = {name: port for name, port in declared.items() if name.startswith("reader-")}
        assert readers == {f"reader-{i}": port for i, port in enumerate(_data_ports(c))}, where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_run_restricted_and_non_root(overlay: str) -> None:
    for where, pod in all_pods(render(overlay)):
        spec = pod["spec"]
        sc = spec["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, where
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert spec["automountServiceAccountToken"] is False, where
        for c in containers(pod):
            csc = c["securityContext"]
            assert csc["allowPrivilegeEscalation"] is False, f"{where}/{c['name']}"
            assert csc["capabilities"] == {"drop": ["ALL"]}, f"{where}/{c['name']}"
            assert csc.get("runAsUser", sc["runAsUser"]) > 0, f"{where}/{c['name']}"
            assert {"cpu", "memory"} <= set(c["resources"]["requests"]), f"{where}/{c['name']}"
            assert "memory" in c["resources"]["limits"], f"{where}/{c['name']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_mounted_secret_keys_pass_the_servers_permission_check(overlay: str) -> None:
    """A Secret volume's files belong to root, group fsGroup, and kubelet adds ``0440`` to
    their mode when fsGroup is set; so a pod of another user reads them through its group,
    which :func:`dataflow.security.check_secret_mode` accepts for another user's file, and no
    other user may read them."""
    for where, pod in all_pods(render(overlay)):
        sc = pod["spec"]["securityContext"]
        for v in pod["spec"].get("volumes", []):
            secret = v.get("secret")
            if secret is None:
                continue
            assert sc["runAsUser"] > 0 and sc.get("fsGroup") is not None, where
            modes = [secret.get("defaultMode", 0o644),
                     *(i["mode"] for i in secret.get("items", []) if "mode" in i)]
            for mode in modes:
                assert (mode | 0o440) & 0o027 == 0, f"{where}/{v['name']}: mode {mode:04o}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_loaders_write_only_to_empty_dirs(overlay: str) -> None:
    for where, pod, c in _loaders(overlay):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, where
        for path in (flag(c["args"], "--cache-dir"), "/tmp"):
            volume = mount_source(pod, c, path)
            assert volume is not None and "emptyDir" in volume, f"{where}: {path}"
        assert all(m.get("readOnly") for m in c["volumeMounts"]
                   if "emptyDir" not in mount_source(pod, c, m["mountPath"])), where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_images_are_pinned_to_the_release(overlay: str) -> None:
    for where, pod in all_pods(render(overlay)):
        for c in containers(pod):
            name, _, tag = c["image"].rpartition(":")
            assert name and tag and tag != "latest", f"{where}/{c['name']}: {c['image']}"
            assert tag == project_version(), f"{where}/{c['name']}: {c['image']}"


@pytest.mark.parametrize("overlay", ["disaggregated", "jobset"])
def test_dns_discovery_names_the_headless_service_and_its_port(overlay: str) -> None:
    docs = render(overlay)
    services = {s["metadata"]["name"]: s for s in docs if s["kind"] == "Service"}
    for where, _, c in _trainers(overlay):
        value = env(c, "DATAFLOW_SERVERS")
        assert value.startswith("dns+tcp://"), f"{where}: {value}"
        host, port = value.removeprefix("dns+tcp://").rsplit(":", 1)
        name, namespace, svc = host.split(".")
        service = services[name]
        assert svc == "svc" and namespace == service["metadata"]["namespace"], f"{where}: {value}"
        assert service["spec"]["clusterIP"] == "None", "discovery needs a headless Service"
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        assert int(port) == ports["dataflow"]["port"], f"{where}: {value}"
        # The Service's pods are the loaders, which listen where it sends clients.
        for lw, pod, loader in _loaders(overlay):
            assert matches(service["spec"]["selector"], pod["metadata"]["labels"]), lw
            target = next(p for p in loader["ports"] if p["name"] == ports["dataflow"][
                "targetPort"])
            assert target["containerPort"] == port_of(flag(loader["args"], "--bind")) == int(
                port), lw


def test_sidecar_loader_is_native_and_serves_its_own_pod() -> None:
    for where, pod, c in _trainers("sidecar"):
        sidecars = [s for s in pod["spec"].get("initContainers", []) if is_loader(s)]
        assert len(sidecars) == 1, where
        assert sidecars[0]["restartPolicy"] == "Always", "a native sidecar"
        bind = flag(sidecars[0]["args"], "--bind")
        assert bind.startswith("tcp://127.0.0.1:"), "loopback only: no other pod reaches it"
        assert env(c, "DATAFLOW_SERVERS") == bind
    docs = render("sidecar")
    assert not {d["kind"] for d in docs} & {"StatefulSet", "NetworkPolicy", "PodDisruptionBudget"}
    assert "dataflow-loader" not in {d["metadata"]["name"] for d in docs if d["kind"] == "Service"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_metrics_port_is_declared(overlay: str) -> None:
    docs = render(overlay)
    for where, _, c in _loaders(overlay):
        metrics = int(flag(c["args"], "--metrics-port"))
        assert flag(c["args"], "--metrics-bind") == "0.0.0.0", f"{where}: scraped from outside"
        declared = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert declared["metrics"] == metrics, where
    for service in (s for s in docs if s["kind"] == "Service"
                    and s["metadata"]["name"] == "dataflow-loader"):
        assert {"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"} in (
            service["spec"]["ports"])


@pytest.mark.parametrize("overlay", ["disaggregated", "jobset"])
def test_network_policy_admits_trainer_pods_only(overlay: str) -> None:
    docs = render(overlay)
    policy = one(docs, "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    loaders = loader_pods(docs)
    trainers = [(w, pod) for w, pod, _ in _trainers(overlay)]
    for where, pod in loaders:
        assert matches(spec["podSelector"]["matchLabels"], pod["metadata"]["labels"]), where
    for rule in spec["ingress"]:
        assert rule.get("from"), "a rule without `from` admits everyone"
        assert rule.get("ports"), "a rule without `ports` admits every port"
    client_rules = [r for r in spec["ingress"]
                    if any(p["port"] == 5555 for p in r["ports"])]
    assert len(client_rules) == 1
    (peer,) = client_rules[0]["from"]
    assert set(peer) == {"podSelector"}, "trainer pods of this namespace, nothing else"
    for where, pod in trainers:
        assert matches(peer["podSelector"]["matchLabels"], pod["metadata"]["labels"]), where
    for where, pod in loaders:
        assert not matches(peer["podSelector"]["matchLabels"], pod["metadata"]["labels"]), where
    # The readers' data ports (--data-ports, one per reader), admitted exactly.
    for where, _, c in _loaders(overlay):
        ports = _data_ports(c)
        assert {"protocol": "TCP", "port": ports[0], "endPort": ports[-1]} in (
            client_rules[0]["ports"]), where


@pytest.mark.parametrize("overlay", ["disaggregated", "jobset"])
def test_disruption_budget_covers_the_loaders(overlay: str) -> None:
    docs = render(overlay)
    pdb = one(docs, "PodDisruptionBudget")
    for where, pod in loader_pods(docs):
        assert matches(pdb["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"]), where
    if overlay == "jobset":
        # Pods of Jobs: only an integer minAvailable is honoured.
        assert set(pdb["spec"]) == {"minAvailable", "selector"}
        loaders = next(rj for rj in one(docs, "JobSet")["spec"]["replicatedJobs"]
                       if rj["name"] == "loaders")
        assert pdb["spec"]["minAvailable"] == loaders["template"]["spec"]["parallelism"]
