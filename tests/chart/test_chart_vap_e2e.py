"""The chart's ValidatingAdmissionPolicy on the real kube-apiserver.

RBAC's ``patch trainjobs/status`` lets the scraper's ServiceAccount change every
status field.  With ``validatingAdmissionPolicy.enabled`` the chart ships a policy
that lets that identity change ``status.trainerStatus`` only; this test applies the
chart's RBAC and policy for real, then writes as the scraper's ServiceAccount (a
TokenRequest token) and as another identity (admin).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import Helm
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import objects
from localdev.cluster.controlplane import ControlPlane

POLICY_ACTIVE_TIMEOUT = 30.0
KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
CONDITION = {"type": "Complete", "status": "True", "reason": "Done", "message": "forged",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}


def _trainer_status(progress: int) -> dict[str, Any]:
    return {"trainerStatus": {"progressPercentage": progress,
                              "lastUpdatedTime": "2026-01-01T00:00:00Z"}}


def _refused(attempt: Callable[[], Any]) -> client.ApiException | None:
    try:
        attempt()
    except client.ApiException as exc:
        return exc
    return None


def test_policy_lets_the_scraper_change_only_trainer_status(
    control_plane: ControlPlane, kube_api: client.ApiClient, trainjob_crd: None,
    namespace: str, helm: Helm, tmp_path: Path, request: pytest.FixtureRequest,
) -> None:
    release = f"vap-{secrets.token_hex(3)}"
    fullname = f"{release}-trainjob-scraper"
    release_namespace = f"scraper-{secrets.token_hex(3)}"
    control_plane.kubectl("create", "namespace", release_namespace)
    rendered = helm.template({"validatingAdmissionPolicy": {"enabled": True}},
                             release=release, namespace=release_namespace)
    manifest = tmp_path / "policy.yaml"
    manifest.write_text(yaml.safe_dump_all(
        [o for o in rendered.objects if o["kind"] in KINDS]))
    control_plane.kubectl("apply", "--server-side", f"--filename={manifest}")
    request.addfinalizer(lambda: control_plane.kubectl(
        "delete", "--ignore-not-found", "--wait=false", f"--filename={manifest}", check=False))

    trainjob = "llm"
    objects.create_trainjob(kube_api, namespace, trainjob)
    # Another identity (the Trainer controller's stand-in: admin) owns the conditions.
    objects.apply_trainjob_status(kube_api, namespace, trainjob,
                                  {"conditions": [{**CONDITION, "type": "Created",
                                                   "message": "by the controller"}]},
                                  field_manager="trainer-controller")
    token = control_plane.service_account_token(release_namespace, fullname)

    with control_plane.api_client_for_token(token) as scraper_api:
        def forge(dry_run: bool) -> Any:
            return objects.apply_trainjob_status(
                scraper_api, namespace, trainjob, {"conditions": [CONDITION]},
                field_manager="trainjob-scraper", dry_run=dry_run)

        # The policy is active once its informer has it: poll with dry runs (admission
        # runs on dry runs too), so nothing is written before.
        deadline = time.monotonic() + POLICY_ACTIVE_TIMEOUT
        while (refusal := _refused(lambda: forge(True))) is None:
            assert time.monotonic() < deadline, "the policy never refused the forged condition"
            time.sleep(0.5)

        # The scraper's own write passes: apply of trainerStatus only.
        written = objects.apply_trainjob_status(scraper_api, namespace, trainjob,
                                                _trainer_status(42),
                                                field_manager="trainjob-scraper")
        assert written["status"]["trainerStatus"]["progressPercentage"] == 42
        written = objects.apply_trainjob_status(scraper_api, namespace, trainjob,
                                                _trainer_status(43),
                                                field_manager="trainjob-scraper")
        assert written["status"]["trainerStatus"]["progressPercentage"] == 43

        # Changing another status field is refused, with the policy's message.
        refusal = _refused(lambda: forge(False))
        assert refusal is not None, "the scraper's identity changed status.conditions"
        assert refusal.status == 403, refusal
        body = str(refusal.body)
        assert f"ValidatingAdmissionPolicy '{fullname}-trainerstatus-only'" in body, body
        assert "may change only status.trainerStatus" in body, body
        assert "status.conditions" in body, body
        user = f"system:serviceaccount:{release_namespace}:{fullname}"
        assert user in body, body
        # ... also a merge patch that adds a status field or clears one.
        custom = client.CustomObjectsApi(scraper_api)
        for patch in ({"status": {"jobsStatus": [{"name": "node", "active": 1, "ready": 1,
                                                  "succeeded": 0, "failed": 0,
                                                  "suspended": 0}]}},
                      {"status": {"conditions": None}}):
            refusal = _refused(lambda p=patch: custom.patch_namespaced_custom_object_status(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob, p))
            assert refusal is not None and refusal.status == 403, patch

    # Another identity is not affected by the policy.
    objects.apply_trainjob_status(kube_api, namespace, trainjob, {"conditions": [CONDITION]},
                                  field_manager="trainer-controller")
    current = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob)
    conditions = {c["type"]: c["message"] for c in current["status"]["conditions"]}
    assert conditions == {"Complete": "forged"}  # the controller's apply replaced its own
    assert current["status"]["trainerStatus"]["progressPercentage"] == 43
