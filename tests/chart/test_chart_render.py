"""The trainjob-scraper chart: lint, render with default and non-default values, schema.

These tests need only the pinned helm binary (no API server).  What the API server
says about the rendered objects is in test_chart_apiserver.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scraper.config import DEFAULT_SELECTOR, load_settings
from tests.helpers.chart import (
    CHART,
    CUSTOM,
    EXPORTER_POLICY,
    FULLNAME,
    MONITORING,
    NAMESPACED,
    RELEASE,
    RELEASE_NAMESPACE,
    VARIANTS,
    Helm,
    Rendered,
)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_helm_lint_strict_passes(helm: Helm, variant: str) -> None:
    result = helm.lint(VARIANTS[variant])
    assert result.ok, f"helm lint --strict ({variant}):\n{result.stdout}\n{result.stderr}"
    assert "0 chart(s) failed" in result.stdout


def test_default_render_has_exactly_the_expected_objects(helm: Helm) -> None:
    rendered = helm.template()
    assert rendered.kinds() == sorted([
        "ServiceAccount", "ConfigMap", "ConfigMap", "Service", "Deployment",
        "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "PodDisruptionBudget",
        # /metrics authentication: the review grants, and the role Prometheus is bound to
        "ClusterRole", "ClusterRoleBinding", "ClusterRole",
        "NetworkPolicy",
    ])
    for obj in rendered.objects:
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "trainjob-scraper"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == RELEASE_NAMESPACE, obj["kind"]


def _container(rendered: Rendered) -> dict[str, Any]:
    deployment = rendered.one("Deployment")
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def test_deployment_is_hardened_with_probes_and_resources(helm: Helm) -> None:
    rendered = helm.template()
    deployment = rendered.one("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2
    assert pod["serviceAccountName"] == FULLNAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    container = _container(rendered)
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["privileged"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}

    assert container["image"] == "trainjob-scraper:0.1.0"  # appVersion
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    assert container["resources"]["limits"]["memory"] == "256Mi"
    assert container["args"] == ["run", "--config=/etc/trainjob-scraper/config.yaml"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/trainjob-scraper"]["readOnly"] is True
    assert "/tmp" in mounts  # scratch space despite the read-only root filesystem
    identity = [e for e in container["env"] if e["name"] == "TRAINJOB_SCRAPER_IDENTITY"]
    assert identity[0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def _settings_from(rendered: Rendered, tmp_path: Path) -> Any:
    config_map = rendered.one("ConfigMap", FULLNAME)
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    return load_settings(config_file=path)


def test_default_config_is_accepted_by_the_scraper(helm: Helm, tmp_path: Path) -> None:
    settings = _settings_from(helm.template(), tmp_path)
    assert settings.namespaces == []
    assert settings.selector == DEFAULT_SELECTOR
    assert settings.interval == 30.0
    assert settings.scrape_timeout == 10.0
    assert settings.listen_port == 8080
    assert settings.leader_election is True
    assert settings.lease_name == FULLNAME
    assert settings.lease_namespace == RELEASE_NAMESPACE
    assert (settings.retry_period, settings.renew_deadline, settings.lease_duration) == (
        2.0, 10.0, 15.0)


def test_custom_config_reaches_the_scraper(helm: Helm, tmp_path: Path) -> None:
    rendered = helm.template(CUSTOM)
    settings = _settings_from(rendered, tmp_path)
    assert settings.interval == 15.0
    assert settings.scrape_timeout == 3.0
    assert settings.concurrency == 64
    assert settings.default_port == 9400
    assert settings.selector == "app=trainer"
    assert settings.log_level == "DEBUG"
    assert settings.max_body_bytes == 4194304
    assert settings.write_qps == 2.5
    assert settings.listen_port == 9090
    assert settings.leader_election is False

    container = _container(rendered)
    assert container["image"] == "registry.example/ml/trainjob-scraper@sha256:" + "ab" * 32
    assert container["args"][-1] == "--resync-interval=1m"
    assert container["ports"][0]["containerPort"] == 9090
    service = rendered.one("Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 80, "targetPort": "metrics", "protocol": "TCP"}]
    assert rendered.one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == (
        "preexisting")
    assert not rendered.of_kind("ServiceAccount")
    # no leader election: no Lease role
    assert not [r for r in rendered.of_kind("Role") if "leader" in r["metadata"]["name"]]
    assert rendered.one("PodDisruptionBudget")["spec"] == {
        "minAvailable": 1, "selector": {"matchLabels": {
            "app.kubernetes.io/name": "trainjob-scraper",
            "app.kubernetes.io/instance": RELEASE}}}
    pod_monitor = rendered.one("PodMonitor")
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert not rendered.of_kind("ServiceMonitor")


def test_config_change_rolls_the_pods(helm: Helm) -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = helm.template(values).one("Deployment")
        annotation: str = deployment["spec"]["template"]["metadata"]["annotations"][
            "checksum/config"]
        return annotation

    assert checksum({}) != checksum({"config": {"interval": "10s"}})


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """(apiGroup, resource, verb, resourceNames) for every grant of a role."""
    out = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    out.add((group, resource, verb, tuple(rule.get("resourceNames", ()))))
    return out


#: Exactly the calls the scraper makes in a watched scope (see scraper/discovery/pods.py,
#: scraper/discovery/identity.py, scraper/shared/trainjobs.py, scraper/write/ and
#: scraper/kube/events.py); any added verb must be justified here too.
SCOPE_GRANTS = {
    ("", "pods", "get", ()),  # scraper/discovery/pod_confirm.py
    ("", "pods", "list", ()),
    ("", "pods", "watch", ()),
    ("trainer.kubeflow.org", "trainjobs", "get", ()),
    ("trainer.kubeflow.org", "trainjobs", "list", ()),
    ("trainer.kubeflow.org", "trainjobs", "watch", ()),
    ("jobset.x-k8s.io", "jobsets", "list", ()),
    ("jobset.x-k8s.io", "jobsets", "watch", ()),
    ("batch", "jobs", "list", ()),
    ("batch", "jobs", "watch", ()),
    ("trainer.kubeflow.org", "trainjobs/status", "patch", ()),
    ("", "events", "create", ()),
    ("", "events", "patch", ()),
}
REVIEW_GRANTS = {("authentication.k8s.io", "tokenreviews", "create", ()),
                 ("authorization.k8s.io", "subjectaccessreviews", "create", ())}
CRD_GRANT = {("apiextensions.k8s.io", "customresourcedefinitions", "get",
              ("trainjobs.trainer.kubeflow.org",))}
#: ``patch`` on the main resource: the stalled-since annotation (config.stall.annotate, on
#: by default) and the trainer-status annotation (config.statusTarget annotation|auto).
ANNOTATION_GRANT = {("trainer.kubeflow.org", "trainjobs", "patch", ())}
#: config.stall.annotate=false: the default install without the stalled-since annotation.
NO_STALL_MARK = {"config": {"stall": {"annotate": False}}}


def test_cluster_rbac_grants_exactly_what_the_scraper_uses(helm: Helm) -> None:
    rendered = helm.template()
    assert _rules(rendered.one("ClusterRole", FULLNAME)) == (
        SCOPE_GRANTS | CRD_GRANT | ANNOTATION_GRANT)
    assert _rules(helm.template(NO_STALL_MARK).one("ClusterRole", FULLNAME)) == (
        SCOPE_GRANTS | CRD_GRANT)
    binding = rendered.one("ClusterRoleBinding", FULLNAME)
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": FULLNAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME,
                                    "namespace": RELEASE_NAMESPACE}]
    lease_role = rendered.one("Role", f"{FULLNAME}-leader-election")
    assert lease_role["metadata"]["namespace"] == RELEASE_NAMESPACE
    assert _rules(lease_role) == {
        ("coordination.k8s.io", "leases", "create", ()),
        ("coordination.k8s.io", "leases", "get", (FULLNAME,)),
        ("coordination.k8s.io", "leases", "update", (FULLNAME,)),
    }


def test_chart_ships_the_rules_file_scoped_not_widened(helm: Helm) -> None:
    """The chart's grants are files/clusterrole-rules.yaml's, only scoped tighter."""
    file_rules = yaml.safe_load((CHART / "files" / "clusterrole-rules.yaml").read_text())
    from_file = {grant[:3] for grant in _rules({"rules": file_rules})}
    annotation_rules = yaml.safe_load((CHART / "files" / "annotation-rules.yaml").read_text())
    from_annotation_file = {grant[:3] for grant in _rules({"rules": annotation_rules})}
    for values, expected in (({}, from_file | from_annotation_file),
                             (NO_STALL_MARK, from_file)):
        rendered = helm.template(values)
        shipped = _rules(rendered.one("ClusterRole", FULLNAME)) | _rules(
            rendered.one("Role", f"{FULLNAME}-leader-election")) | _rules(
            rendered.one("ClusterRole", f"{FULLNAME}-metrics-auth"))
        assert {grant[:3] for grant in shipped} == expected, values


def test_namespace_list_gives_roles_per_namespace_and_no_cluster_scope(helm: Helm) -> None:
    rendered = helm.template(NAMESPACED)
    roles = {r["metadata"]["namespace"]: r for r in rendered.of_kind("Role")
             if r["metadata"]["name"] == FULLNAME}
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert _rules(role) == SCOPE_GRANTS | ANNOTATION_GRANT
    for role in helm.template({"config": {**NAMESPACED["config"], "stall": {
            "annotate": False}}}).of_kind("Role"):
        if role["metadata"]["name"] == FULLNAME:
            assert _rules(role) == SCOPE_GRANTS
    bindings = {b["metadata"]["namespace"] for b in rendered.of_kind("RoleBinding")
                if b["metadata"]["name"] == FULLNAME}
    assert bindings == {"team-a", "team-b"}
    # The only cluster-scoped grants left: reading the one CRD, and the reviews of the
    # /metrics authentication (cluster-scoped resources).
    cluster_roles = {r["metadata"]["name"]: r for r in rendered.of_kind("ClusterRole")}
    assert sorted(cluster_roles) == [f"{FULLNAME}-crd", f"{FULLNAME}-metrics-auth",
                                     f"{FULLNAME}-metrics-reader"]
    assert _rules(cluster_roles[f"{FULLNAME}-crd"]) == CRD_GRANT
    assert _rules(cluster_roles[f"{FULLNAME}-metrics-auth"]) == REVIEW_GRANTS


def test_monitoring_values_render_servicemonitor_networkpolicy_dashboard(helm: Helm) -> None:
    rendered = helm.template(MONITORING)
    monitor = rendered.one("ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    service = rendered.one("Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]

    policy = rendered.one("NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    assert policy["podSelector"]["matchLabels"] == rendered.one("Deployment")["spec"][
        "selector"]["matchLabels"]
    api_rule, exporter_rule = policy["egress"]
    assert api_rule == {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}},
                               {"ipBlock": {"cidr": "192.168.10.0/24"}}],
                        "ports": [{"port": 6443, "protocol": "TCP"}]}
    assert exporter_rule == {"to": [{"namespaceSelector": {}}],
                             "ports": [{"port": 28080, "protocol": "TCP"},
                                       {"port": 9400, "protocol": "TCP"}]}
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}],
                                  "from": MONITORING["networkPolicy"]["metricsIngress"]["from"]}]

    dashboard = rendered.one("ConfigMap", f"{FULLNAME}-dashboard")
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "Training"}


def test_networkpolicy_limits_exporter_egress_to_the_watched_namespaces(helm: Helm) -> None:
    values = {**NAMESPACED, "networkPolicy": MONITORING["networkPolicy"]}
    policy = helm.template(values).one("NetworkPolicy")["spec"]
    assert policy["egress"][1]["to"] == [{"namespaceSelector": {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In",
        "values": ["team-a", "team-b"]}]}}]


def _tcp_ports(rule: dict[str, Any]) -> set[int]:
    ports: set[int] = set()
    for entry in rule["ports"]:
        if entry["protocol"] == "TCP":
            ports.update(range(entry["port"], entry.get("endPort", entry["port"]) + 1))
    return ports


def test_exporter_policy_opens_the_exporter_port_to_the_scraper_pods_only(helm: Helm) -> None:
    # The scraper's own ingress policy (on by default) is not one of the exporter's.
    policies = [p for p in helm.template(EXPORTER_POLICY).of_kind("NetworkPolicy")
                if p["metadata"]["namespace"] != RELEASE_NAMESPACE]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["team-a", "team-b"]
    for policy in policies:
        spec = policy["spec"]
        assert spec["policyTypes"] == ["Ingress"], "egress of training pods is not touched"
        assert spec["podSelector"] == {"matchExpressions": [
            {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
        exporter, others = spec["ingress"]
        assert _tcp_ports(exporter) == {9400, 28080}
        scraper, *extra = exporter["from"]
        assert scraper == {
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": RELEASE_NAMESPACE}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "trainjob-scraper",
                                            "app.kubernetes.io/instance": RELEASE}}}
        assert extra == EXPORTER_POLICY["exporterNetworkPolicy"]["extraFrom"]
        # Every other port stays open to anyone (no "from"): training traffic unaffected.
        assert "from" not in others
        assert _tcp_ports(others) == set(range(1, 65536)) - {9400, 28080}
        assert {"protocol": "UDP"} in others["ports"] and {"protocol": "SCTP"} in others["ports"]


@pytest.mark.parametrize("ports", [[], [1], [65535], [1, 2, 65535], [28080, 28081]])
def test_exporter_policy_leaves_every_other_tcp_port_open(helm: Helm, ports: list[int]) -> None:
    values = {"exporterNetworkPolicy": {"enabled": True, "namespaces": ["ml"], "ports": ports}}
    exporter, others = helm.template(values).one("NetworkPolicy", f"{FULLNAME}-exporter")[
        "spec"]["ingress"]
    expected = set(ports) or {28080}  # empty: config.defaultPort
    assert _tcp_ports(exporter) == expected
    assert _tcp_ports(others) == set(range(1, 65536)) - expected


@pytest.mark.parametrize(("values", "message"), [
    ({"exporterNetworkPolicy": {"enabled": True}},
     "exporterNetworkPolicy.namespaces must list the training namespaces"),
    ({"exporterNetworkPolicy": {"enabled": True, "namespaces": ["ml"], "ports": [28080, 9400]}},
     "exporterNetworkPolicy.ports must be ascending without repeats: 9400 after 28080"),
])
def test_exporter_policy_refuses_values_it_cannot_honour(
        helm: Helm, values: dict[str, Any], message: str) -> None:
    result = helm.template_result(values)
    assert not result.ok and message in result.stderr, result.stderr


def test_dashboard_configmap_ships_the_repository_json(helm: Helm) -> None:
    config_map = helm.template().one("ConfigMap", f"{FULLNAME}-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(config_map["data"]["trainjob-progress.json"])
    assert shipped == json.loads((CHART / "dashboards" / "trainjob-progress.json").read_text())
    assert not helm.template({"dashboard": {"enabled": False}}).of_kind("ConfigMap")[1:]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"replicaCount": "two"}, ["/replicaCount", "want integer"], id="type"),
        pytest.param({"replicaCount": 0}, ["/replicaCount", "minimum"], id="minimum"),
        pytest.param({"config": {"interval": "soon"}}, ["/config/interval", "'soon'"],
                     id="duration"),
        pytest.param({"config": {"namespaces": ["Team_A"]}}, ["/config/namespaces/0", "Team_A"],
                     id="namespace-name"),
        pytest.param({"config": {"intervall": "15s"}}, ["'intervall' not allowed"], id="typo"),
        pytest.param({"networkPolicy": {"egress": {"enabled": True}}},
                     ["/networkPolicy/egress/apiServer/cidrs", "minItems"],
                     id="networkpolicy-egress-needs-cidrs"),
        pytest.param({"podMonitor": {"enabled": True}},
                     ["/podMonitor/authorization", "credentials"],
                     id="podmonitor-needs-a-token-secret"),
        pytest.param({"metrics": {"auth": {"cacheTTL": "2 minutes"}}},
                     ["/metrics/auth/cacheTTL"], id="cache-ttl"),
        pytest.param({"metrics": {"auth": {"readers": [{"kind": "ServiceAccount"}]}}},
                     ["/metrics/auth/readers/0", "name"], id="reader-subject"),
        pytest.param({"validatingAdmissionPolicy": {"validationActions": ["Block"]}},
                     ["/validatingAdmissionPolicy/validationActions/0"], id="vap-action"),
        pytest.param({"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
                     ["/podMonitor/enabled", "must be false"], id="one-monitor"),
        pytest.param({"exporterNetworkPolicy": {"enabled": True, "ports": [0]}},
                     ["/exporterNetworkPolicy/ports/0", "minimum"], id="exporter-port"),
        pytest.param({"image": {"pullPolicy": "Sometimes"}},
                     ["/image/pullPolicy", "must be one of"], id="enum"),
        pytest.param({"config": {"statusTarget": "annotations"}},
                     ["/config/statusTarget", "must be one of"], id="status-target"),
        # The scraper's own bound (scraper/config.py): below it the budget broke.
        pytest.param({"config": {"writeQps": 0.001}}, ["/config/writeQps", "minimum"],
                     id="write-qps-floor"),
        pytest.param({"config": {"writeQpsMax": 0}}, ["/config/writeQpsMax", "minimum"],
                     id="write-qps-max"),
        pytest.param({"flowControl": {"limitResponse": "Drop"}},
                     ["/flowControl/limitResponse", "must be one of"], id="flow-control"),
    ],
)
def test_bad_values_are_rejected_by_the_schema(
    helm: Helm, values: dict[str, Any], expected: list[str]
) -> None:
    result = helm.template_result(values)
    assert not result.ok, f"helm accepted {values}"
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    for word in expected:
        assert word in result.stderr, f"{word!r} not in:\n{result.stderr}"


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["name"] == "trainjob-scraper"
    assert chart["apiVersion"] == "v2"
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    # every top-level value is described by the schema (additionalProperties is false)
    assert schema["additionalProperties"] is False
    assert set(values) <= set(schema["properties"])


# ---------------------------------------------------------------- /metrics authentication


def test_metrics_auth_is_on_by_default_with_its_grants(helm: Helm, tmp_path: Path) -> None:
    rendered = helm.template()
    settings = _settings_from(rendered, tmp_path)
    assert settings.metrics_auth is True
    assert (settings.metrics_auth_cache_ttl, settings.metrics_auth_cache_size) == (120.0, 1024)
    assert _rules(rendered.one("ClusterRole", f"{FULLNAME}-metrics-auth")) == REVIEW_GRANTS
    binding = rendered.one("ClusterRoleBinding", f"{FULLNAME}-metrics-auth")
    assert binding["roleRef"]["name"] == f"{FULLNAME}-metrics-auth"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME,
                                    "namespace": RELEASE_NAMESPACE}]
    reader = rendered.one("ClusterRole", f"{FULLNAME}-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # Nobody is bound to the reader role unless metrics.auth.readers says so.
    assert not [b for b in rendered.of_kind("ClusterRoleBinding")
                if b["roleRef"]["name"] == f"{FULLNAME}-metrics-reader"]
    # The probes need no token: they use the open paths.
    container = _container(rendered)
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_metrics_readers_are_bound_to_the_reader_role(helm: Helm) -> None:
    rendered = helm.template(MONITORING)
    binding = rendered.one("ClusterRoleBinding", f"{FULLNAME}-metrics-reader")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io",
                                  "kind": "ClusterRole", "name": f"{FULLNAME}-metrics-reader"}
    assert binding["subjects"] == MONITORING["metrics"]["auth"]["readers"]


def test_monitors_send_a_bearer_token(helm: Helm) -> None:
    endpoint = helm.template(MONITORING).one("ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert "authorization" not in endpoint
    secret = {"type": "Bearer", "credentials": {"name": "prom-token", "key": "token"}}
    endpoint = helm.template({"serviceMonitor": {"enabled": True, "authorization": secret}}
                             ).one("ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["authorization"] == secret
    assert "bearerTokenFile" not in endpoint
    pod_endpoint = helm.template(CUSTOM).one("PodMonitor")["spec"]["podMetricsEndpoints"][0]
    assert pod_endpoint["authorization"] == CUSTOM["podMonitor"]["authorization"]


def test_metrics_auth_opt_out_drops_grants_and_tokens(helm: Helm, tmp_path: Path) -> None:
    values = {"metrics": {"auth": {"enabled": False}}, "serviceMonitor": {"enabled": True}}
    rendered = helm.template(values)
    assert _settings_from(rendered, tmp_path).metrics_auth is False
    names = {o["metadata"]["name"] for o in rendered.objects}
    assert f"{FULLNAME}-metrics-auth" not in names
    assert f"{FULLNAME}-metrics-reader" not in names
    endpoint = rendered.one("ServiceMonitor")["spec"]["endpoints"][0]
    assert "bearerTokenFile" not in endpoint and "authorization" not in endpoint
    podmonitor = helm.template({"metrics": {"auth": {"enabled": False}},
                                "podMonitor": {"enabled": True}}).one("PodMonitor")
    assert "authorization" not in podmonitor["spec"]["podMetricsEndpoints"][0]


def test_default_networkpolicy_limits_ingress_to_the_metrics_port_only(helm: Helm) -> None:
    rendered = helm.template()
    policy = rendered.one("NetworkPolicy")["spec"]
    assert policy["podSelector"]["matchLabels"] == rendered.one("Deployment")["spec"][
        "selector"]["matchLabels"]
    # Ingress only: egress (API server, exporters) is not restricted by default.
    assert policy["policyTypes"] == ["Ingress"]
    assert "egress" not in policy
    # From anywhere, so Prometheus wherever it runs and the kubelet's probes (on the same
    # named port) keep working.
    assert policy["ingress"] == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}]
    container = _container(rendered)
    assert [p["name"] for p in container["ports"]] == ["metrics"]
    assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    assert container["readinessProbe"]["httpGet"]["port"] == "metrics"
    assert not helm.template({"networkPolicy": {"enabled": False}}).of_kind("NetworkPolicy")


def test_validating_admission_policy_is_optional_and_names_the_scraper(helm: Helm) -> None:
    assert not helm.template().of_kind("ValidatingAdmissionPolicy")
    values = {"validatingAdmissionPolicy": {"enabled": True},
              "serviceAccount": {"create": False, "name": "preexisting"}}
    name = f"{FULLNAME}-trainerstatus-only"
    expected = {name: (["trainjobs/status"], ["UPDATE"]),
                f"{name}-events": (["events"], ["CREATE", "UPDATE"])}
    without_mark = helm.template({**values, **NO_STALL_MARK})
    assert {p["metadata"]["name"] for p in without_mark.of_kind(
        "ValidatingAdmissionPolicy")} == set(expected)
    # The default writes the stalled-since annotation: the annotation policy comes too.
    rendered = helm.template(values)
    expected[f"{name}-annotation"] = (["trainjobs"], ["CREATE", "UPDATE"])
    assert {p["metadata"]["name"] for p in rendered.of_kind("ValidatingAdmissionPolicy")} \
        == set(expected)
    for policy_name, (resources, operations) in expected.items():
        policy = rendered.one("ValidatingAdmissionPolicy", policy_name)
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == ('request.userInfo.username == '
                                           f'"system:serviceaccount:{RELEASE_NAMESPACE}:preexisting"')
        (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
        assert (rule["resources"], rule["operations"]) == (resources, operations)
        binding = rendered.one("ValidatingAdmissionPolicyBinding", policy_name)
        assert binding["spec"] == {"policyName": policy_name, "validationActions": ["Deny"]}


def test_write_ceiling_reaches_the_scraper_and_flow_control_is_optional(
        helm: Helm, tmp_path: Path) -> None:
    rendered = helm.template()
    assert not rendered.of_kind("FlowSchema")
    assert not rendered.of_kind("PriorityLevelConfiguration")
    assert _settings_from(rendered, tmp_path).write.qps_max == 200.0

    rendered = helm.template({
        "config": {"writeQps": 30, "writeQpsMax": 500},
        "flowControl": {"enabled": True, "limitResponse": "Reject"},
        "serviceAccount": {"create": False, "name": "preexisting"}})
    settings = _settings_from(rendered, tmp_path)
    assert (settings.write_qps, settings.write.qps_max) == (30, 500)
    level = rendered.one("PriorityLevelConfiguration", FULLNAME)
    assert level["spec"] == {"type": "Limited", "limited": {
        "nominalConcurrencyShares": 10, "lendablePercent": 0,
        "limitResponse": {"type": "Reject"}}}
    schema = rendered.one("FlowSchema", FULLNAME)
    assert schema["spec"]["priorityLevelConfiguration"] == {"name": FULLNAME}
    assert schema["spec"]["matchingPrecedence"] == 500
    (rule,) = schema["spec"]["rules"]
    assert rule["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {
        "name": "preexisting", "namespace": RELEASE_NAMESPACE}}]
    # The TrainJob reads and writes only: the Lease and the watches keep their levels.
    assert rule["resourceRules"] == [{
        "apiGroups": ["trainer.kubeflow.org"], "resources": ["trainjobs", "trainjobs/status"],
        "verbs": ["get", "patch", "update"], "namespaces": ["*"]}]
    assert "nonResourceRules" not in rule

    queued = helm.template({"flowControl": {"enabled": True, "queues": 8}})
    assert queued.one("PriorityLevelConfiguration", FULLNAME)["spec"]["limited"][
        "limitResponse"] == {"type": "Queue", "queuing": {
            "queues": 8, "queueLengthLimit": 50, "handSize": 4}}
    assert queued.one("FlowSchema", FULLNAME)["spec"]["rules"][0]["subjects"][0][
        "serviceAccount"] == {"name": FULLNAME, "namespace": RELEASE_NAMESPACE}


# ---------------------------------------------------------------- the annotation target



@pytest.mark.parametrize("target", ["annotation", "auto"])
def test_status_target_reaches_the_scraper_and_adds_patch_on_trainjobs_only_then(
        helm: Helm, tmp_path: Path, target: str) -> None:
    # Without the stalled-since annotation (on by default: the next test), patch on
    # trainjobs comes only from a target that writes the trainer-status annotation.
    assert _settings_from(helm.template(), tmp_path).status_target == "status"
    assert not _rules(helm.template(NO_STALL_MARK).one("ClusterRole", FULLNAME)) & \
        ANNOTATION_GRANT
    rendered = helm.template({"config": {"statusTarget": target, "stall": {"annotate": False}}})
    assert _settings_from(rendered, tmp_path).status_target == target
    assert _rules(rendered.one("ClusterRole", FULLNAME)) == (
        SCOPE_GRANTS | CRD_GRANT | ANNOTATION_GRANT)
    namespaced = helm.template({**NAMESPACED, "config": {**NAMESPACED["config"],
                                                         "statusTarget": target,
                                                         "stall": {"annotate": False}}})
    for role in namespaced.of_kind("Role"):
        if role["metadata"]["name"] == FULLNAME:
            assert _rules(role) == SCOPE_GRANTS | ANNOTATION_GRANT
    # The grant is the file's (one source with the scraper's own RBAC tests).
    extra = yaml.safe_load((CHART / "files" / "annotation-rules.yaml").read_text())
    assert {g for g in _rules({"rules": extra})} == ANNOTATION_GRANT


def test_the_stalled_since_annotation_is_written_by_default_and_granted(
        helm: Helm, tmp_path: Path) -> None:
    """config.stall.annotate defaults to true, so `kubectl trainjob progress` shows a stall
    on a default install: the scraper is told to write it and may patch TrainJobs."""
    default = helm.template()
    assert _settings_from(default, tmp_path).stall_annotate is True
    assert _rules(default.one("ClusterRole", FULLNAME)) & ANNOTATION_GRANT
    off = helm.template(NO_STALL_MARK)
    assert _settings_from(off, tmp_path).stall_annotate is False
    assert not _rules(off.one("ClusterRole", FULLNAME)) & ANNOTATION_GRANT


def test_annotation_policy_ships_only_with_a_writer_of_an_annotation(helm: Helm) -> None:
    name = f"{FULLNAME}-trainerstatus-only-annotation"
    policies = helm.template({"validatingAdmissionPolicy": {"enabled": True},
                              **NO_STALL_MARK}).of_kind("ValidatingAdmissionPolicy")
    assert name not in {p["metadata"]["name"] for p in policies}
    # The stalled-since annotation (the default) or the trainer-status one brings it.
    for config in ({}, {"statusTarget": "auto", "stall": {"annotate": False}}):
        rendered = helm.template({"validatingAdmissionPolicy": {"enabled": True},
                                  "config": config})
        assert name in {p["metadata"]["name"] for p in rendered.of_kind(
            "ValidatingAdmissionPolicy")}, config
    rendered = helm.template({"validatingAdmissionPolicy": {"enabled": True},
                              "config": {"statusTarget": "auto"}})
    policy = rendered.one("ValidatingAdmissionPolicy", name)
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["resources"], rule["operations"]) == (["trainjobs"], ["CREATE", "UPDATE"])
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == ("request.userInfo.username == "
                                       f'"system:serviceaccount:{RELEASE_NAMESPACE}:{FULLNAME}"')
    assert rendered.one("ValidatingAdmissionPolicyBinding", name)["spec"] == {
        "policyName": name, "validationActions": ["Deny"]}
    assert not helm.template({"config": {"statusTarget": "auto"}}).of_kind(
        "ValidatingAdmissionPolicy")


# ---------------------------------------------------------------- the log source


LOG_GRANT = {("", "pods/log", "get", ())}


def test_log_source_reaches_the_scraper_and_adds_get_on_pods_log_only_then(
        helm: Helm, tmp_path: Path) -> None:
    default = helm.template()
    assert _settings_from(default, tmp_path).log_source is False
    assert not _rules(default.one("ClusterRole", FULLNAME)) & LOG_GRANT
    values = {"enabled": True, "qps": 2, "burst": 4, "limitBytes": 32768, "tailLines": 50}
    rendered = helm.template({"config": {"logSource": values}})
    settings = _settings_from(rendered, tmp_path)
    assert (settings.log_source, settings.log_qps, settings.log_burst,
            settings.log_limit_bytes, settings.log_tail_lines) == (True, 2, 4, 32768, 50)
    assert _rules(rendered.one("ClusterRole", FULLNAME)) == (
        SCOPE_GRANTS | CRD_GRANT | ANNOTATION_GRANT | LOG_GRANT)
    namespaced = helm.template({**NAMESPACED, "config": {**NAMESPACED["config"],
                                                         "logSource": values}})
    roles = [r for r in namespaced.of_kind("Role") if r["metadata"]["name"] == FULLNAME]
    assert roles and all(_rules(role) == SCOPE_GRANTS | ANNOTATION_GRANT | LOG_GRANT
                         for role in roles)
    extra = yaml.safe_load((CHART / "files" / "log-rules.yaml").read_text())
    assert set(_rules({"rules": extra})) == LOG_GRANT


@pytest.mark.parametrize("bad", [{"limitBytes": 1024}, {"qps": 0}, {"enabled": "yes"},
                                 {"tailLine": 5}])
def test_log_source_values_are_checked_by_the_schema(helm: Helm, bad: dict[str, Any]) -> None:
    result = helm.template_result({"config": {"logSource": bad}})
    assert not result.ok, f"helm accepted {bad}"
    assert "/config/logSource" in result.stderr, result.stderr


BOOST_GRANTS = {("kueue.x-k8s.io", "workloads", "list", ()),
                ("kueue.x-k8s.io", "workloads", "patch", ())}


def test_priority_boost_is_off_by_default_and_grants_workloads_only_when_on(
        helm: Helm, tmp_path: Path) -> None:
    default = helm.template()
    assert _settings_from(default, tmp_path).priority_boost_max == 0
    assert not _rules(default.one("ClusterRole", FULLNAME)) & BOOST_GRANTS
    rendered = helm.template({"config": {"priorityBoost": {"max": 50}}})
    assert _settings_from(rendered, tmp_path).priority_boost_max == 50
    assert _rules(rendered.one("ClusterRole", FULLNAME)) == (
        SCOPE_GRANTS | CRD_GRANT | ANNOTATION_GRANT | BOOST_GRANTS)
    namespaced = helm.template({**NAMESPACED, "config": {**NAMESPACED["config"],
                                                         "priorityBoost": {"max": 50}}})
    roles = [r for r in namespaced.of_kind("Role") if r["metadata"]["name"] == FULLNAME]
    assert roles and all(_rules(role) >= BOOST_GRANTS for role in roles)
    extra = yaml.safe_load((CHART / "files" / "boost-rules.yaml").read_text())
    assert set(_rules({"rules": extra})) == BOOST_GRANTS


@pytest.mark.parametrize("bad", [{"max": -1}, {"max": 1_000_001}, {"max": "ten"},
                                 {"maximum": 5}])
def test_priority_boost_values_are_checked_by_the_schema(helm: Helm,
                                                          bad: dict[str, Any]) -> None:
    result = helm.template_result({"config": {"priorityBoost": bad}})
    assert not result.ok, f"helm accepted {bad}"
    assert "/config/priorityBoost" in result.stderr, result.stderr
