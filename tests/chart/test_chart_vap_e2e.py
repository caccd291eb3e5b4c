"""The chart's ValidatingAdmissionPolicy on the real kube-apiserver.

RBAC's ``patch trainjobs/status`` lets the scraper's ServiceAccount change every
status field, and ``create``/``patch`` on events any Event.  With
``validatingAdmissionPolicy.enabled`` the chart ships policies that let that identity
change ``status.trainerStatus`` only, write only Events about TrainJobs (patching only
its own) and change only its own annotations of a TrainJob (``stalled-since``, written
by default, and the trainer-status one); these tests apply the chart's RBAC and
policies for real, then write as the scraper's ServiceAccount (a TokenRequest token) and
as another identity (admin).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus
from exporter_lib.status_annotation import TRAINER_STATUS_ANNOTATION
from localdev.cluster import objects
from localdev.cluster.controlplane import ControlPlane
from scraper.kube.apply_request import APPLY_CONTENT_TYPE, encode_apply_body
from scraper.shared.outcome import FIELD_MANAGER
from scraper.stall.marker import write_stall_marker
from scraper.stall.rule import STALLED_SINCE_ANNOTATION
from scraper.write.annotation_target import Place, apply_request
from tests.helpers.chart import Helm

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


@dataclass
class Release:
    fullname: str
    namespace: str
    token: str  # the scraper's ServiceAccount's


@pytest.fixture
def release(control_plane: ControlPlane, helm: Helm, tmp_path: Path,
            request: pytest.FixtureRequest) -> Release:
    """The chart's RBAC and policies applied, and a token of its ServiceAccount."""
    return _install(control_plane, helm, tmp_path, request, {})


@pytest.fixture
def annotation_release(control_plane: ControlPlane, helm: Helm, tmp_path: Path,
                       request: pytest.FixtureRequest) -> Release:
    """:func:`release` with ``config.statusTarget=annotation``."""
    return _install(control_plane, helm, tmp_path, request,
                    {"config": {"statusTarget": "annotation"}})


@pytest.fixture
def unmarked_release(control_plane: ControlPlane, helm: Helm, tmp_path: Path,
                     request: pytest.FixtureRequest) -> Release:
    """:func:`release` with ``config.stall.annotate=false``."""
    return _install(control_plane, helm, tmp_path, request,
                    {"config": {"stall": {"annotate": False}}})


def _install(control_plane: ControlPlane, helm: Helm, tmp_path: Path,
             request: pytest.FixtureRequest, values: dict[str, Any]) -> Release:
    name = f"vap-{secrets.token_hex(3)}"
    fullname = f"{name}-trainjob-scraper"
    release_namespace = f"scraper-{secrets.token_hex(3)}"
    control_plane.kubectl("create", "namespace", release_namespace)
    rendered = helm.template({"validatingAdmissionPolicy": {"enabled": True}, **values},
                             release=name, namespace=release_namespace)
    manifest = tmp_path / "policy.yaml"
    manifest.write_text(yaml.safe_dump_all(
        [o for o in rendered.objects if o["kind"] in KINDS]))
    control_plane.kubectl("apply", "--server-side", f"--filename={manifest}")
    request.addfinalizer(lambda: control_plane.kubectl(
        "delete", "--ignore-not-found", "--wait=false", f"--filename={manifest}", check=False))
    return Release(fullname, release_namespace,
                   control_plane.service_account_token(release_namespace, fullname))


def _until_refused(attempt: Callable[[], Any]) -> client.ApiException:
    """Repeat a dry-run ``attempt`` until a policy refuses it (policies become active
    once their informer has them; admission runs on dry runs too)."""
    deadline = time.monotonic() + POLICY_ACTIVE_TIMEOUT
    while (refusal := _refused(attempt)) is None:
        assert time.monotonic() < deadline, "the policy never refused"
        time.sleep(0.5)
    return refusal


def test_policy_lets_the_scraper_change_only_trainer_status(
    control_plane: ControlPlane, kube_api: client.ApiClient, trainjob_crd: None,
    namespace: str, release: Release,
) -> None:
    fullname, release_namespace, token = release.fullname, release.namespace, release.token

    trainjob = "llm"
    objects.create_trainjob(kube_api, namespace, trainjob)
    # Another identity (the Trainer controller's stand-in: admin) owns the conditions.
    objects.apply_trainjob_status(kube_api, namespace, trainjob,
                                  {"conditions": [{**CONDITION, "type": "Created",
                                                   "message": "by the controller"}]},
                                  field_manager="trainer-controller")

    with control_plane.api_client_for_token(token) as scraper_api:
        def forge(dry_run: bool) -> Any:
            return objects.apply_trainjob_status(
                scraper_api, namespace, trainjob, {"conditions": [CONDITION]},
                field_manager="trainjob-scraper", dry_run=dry_run)

        _until_refused(lambda: forge(True))

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


def _event(namespace: str, name: str, kind: str, api_version: str, component: str,
           dry_run: bool = False) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {"apiVersion": api_version, "kind": kind, "name": "x",
                               "namespace": namespace},
            "reason": "Test", "message": "m", "type": "Warning",
            "source": {"component": component}, "reportingComponent": component,
            "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z",
            "count": 1}


def test_policy_keeps_the_scrapers_events_to_trainjobs(
    control_plane: ControlPlane, kube_api: client.ApiClient, namespace: str,
    release: Release,
) -> None:
    trainjob_kind = ("TrainJob", f"{API_GROUP}/{API_VERSION}")
    admin = client.CoreV1Api(kube_api)
    # Events of other components, which the scraper must not rewrite.
    admin.create_namespaced_event(namespace, _event(namespace, "by-controller", *trainjob_kind,
                                                    "trainer-controller"))
    with control_plane.api_client_for_token(release.token) as scraper_api:
        core = client.CoreV1Api(scraper_api)
        refusal = _until_refused(lambda: core.create_namespaced_event(
            namespace, _event(namespace, "about-pod", "Pod", "v1", "trainjob-scraper"),
            dry_run="All"))
        assert refusal.status == 403
        assert "may record Events only about TrainJobs" in str(refusal.body)

        # What the scraper does: an Event on a TrainJob, then a count bump.
        core.create_namespaced_event(namespace, _event(namespace, "mine", *trainjob_kind,
                                                       "trainjob-scraper"))
        core.patch_namespaced_event("mine", namespace, {"count": 2})
        assert admin.read_namespaced_event("mine", namespace).count == 2

        refused = {
            "Event about a Pod": lambda: core.create_namespaced_event(
                namespace, _event(namespace, "p", "Pod", "v1", "trainjob-scraper")),
            "Event about a look-alike kind": lambda: core.create_namespaced_event(
                namespace, _event(namespace, "q", "TrainJob", "evil.example/v1",
                                  "trainjob-scraper")),
            "patch another component's Event": lambda: core.patch_namespaced_event(
                "by-controller", namespace, {"message": "rewritten"}),
            "turn its own Event into one about a Pod": lambda: core.patch_namespaced_event(
                "mine", namespace, {"involvedObject": {"kind": "Pod", "apiVersion": "v1"}}),
        }
        for what, attempt in refused.items():
            exc = _refused(attempt)
            assert exc is not None and exc.status == 403, what
            assert "ValidatingAdmissionPolicy" in str(exc.body), (what, exc.body)

    # Another identity is not affected.
    admin.create_namespaced_event(namespace, _event(namespace, "pod-event", "Pod", "v1",
                                                    "kubelet"))
    admin.patch_namespaced_event("by-controller", namespace, {"message": "by the owner"})


def _apply_annotation(api: client.ApiClient, namespace: str, name: str, progress: int,
                      uid: str, **meta: Any) -> dict[str, Any]:
    """The scraper's own annotation write (:mod:`scraper.write.annotation_target`),
    plus ``meta``."""
    status = TrainerStatus.from_api({"progressPercentage": progress,
                                     "lastUpdatedTime": "2026-01-01T00:00:00Z"})
    path, params, body = apply_request(Place.ANNOTATION, namespace, name, status, uid)
    for key, value in meta.items():
        body["metadata"][key] = {**body["metadata"].get(key, {}), **value}
    resp = api.call_api(path, "PATCH", params,
                        [("fieldManager", FIELD_MANAGER), ("force", "true")],
                        {"Content-Type": APPLY_CONTENT_TYPE, "Accept": "application/json"},
                        body=encode_apply_body(body), auth_settings=["BearerToken"],
                        _return_http_data_only=True, _preload_content=False)
    result: dict[str, Any] = yaml.safe_load(resp.data)
    return result


def test_annotation_policy_lets_the_scraper_change_only_its_annotation(
    control_plane: ControlPlane, kube_api: client.ApiClient, legacy_trainjob_crd: None,
    namespace: str, annotation_release: Release,
) -> None:
    fullname, token = annotation_release.fullname, annotation_release.token
    trainjob = "old"
    created = objects.create_trainjob(kube_api, namespace, trainjob)
    uid = created["metadata"]["uid"]
    custom_admin = client.CustomObjectsApi(kube_api)
    custom_admin.patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
        {"metadata": {"annotations": {"team.example/owner": "alice"}}})

    with control_plane.api_client_for_token(token) as scraper_api:
        custom = client.CustomObjectsApi(scraper_api)

        def relabel() -> Any:
            return custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
                {"metadata": {"labels": {"forged": "true"}}}, dry_run="All")

        refusal = _until_refused(relabel)
        assert refusal.status == 403 and f"'{fullname}-trainerstatus-only-annotation'" in \
            str(refusal.body), refusal.body
        assert "labels, finalizers or owner references" in str(refusal.body)

        # The scraper's own writes pass (RBAC: patch on trainjobs, from statusTarget).
        for progress in (42, 43):
            written = _apply_annotation(scraper_api, namespace, trainjob, progress, uid)
            assert TRAINER_STATUS_ANNOTATION in written["metadata"]["annotations"]
        # Anything else is refused, each with the policy's message.
        attempts: dict[str, Callable[[], Any]] = {
            "annotation team.example/owner": lambda: custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
                {"metadata": {"annotations": {"team.example/owner": None}}}),
            "annotation forged.example/x": lambda: _apply_annotation(
                scraper_api, namespace, trainjob, 44, uid,
                annotations={"forged.example/x": "1"}),
            "spec": lambda: custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
                {"spec": {"suspend": True}}),
            "labels, finalizers or owner references": lambda: custom.patch_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
                {"metadata": {"finalizers": ["forged.example/keep"]}}),
        }
        for what, attempt in attempts.items():
            refused = _refused(attempt)
            assert refused is not None and refused.status == 403, (what, refused)
            assert f"this request also changes {what}" in str(refused.body), (what,
                                                                                refused.body)

    current = custom_admin.get_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob)
    annotations = current["metadata"]["annotations"]
    assert annotations["team.example/owner"] == "alice" and "forged.example/x" not in annotations
    assert '"progressPercentage":43' in annotations[TRAINER_STATUS_ANNOTATION]
    assert not current["metadata"].get("finalizers") and "suspend" not in current["spec"]
    # Another identity is not affected by the policy.
    custom_admin.patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
        {"metadata": {"labels": {"by": "admin"}}})


def test_the_default_lets_the_scraper_mark_a_stall_and_nothing_else(
    control_plane: ControlPlane, kube_api: client.ApiClient, trainjob_crd: None,
    namespace: str, release: Release,
) -> None:
    """config.stall.annotate is on by default: the chart's RBAC lets the scraper's
    identity write the stalled-since annotation (its real write, scraper.stall.marker),
    the annotation policy keeps every other part of the TrainJob from it."""
    trainjob = "hung"
    uid = objects.create_trainjob(kube_api, namespace, trainjob)["metadata"]["uid"]
    admin = client.CustomObjectsApi(kube_api)
    admin.patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
        {"metadata": {"annotations": {"team.example/owner": "alice"}}})

    def annotations() -> dict[str, str]:
        obj = admin.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                                 TRAINJOB_PLURAL, trainjob)
        found: dict[str, str] = obj["metadata"].get("annotations") or {}
        return found

    with control_plane.api_client_for_token(release.token) as scraper_api:
        custom = client.CustomObjectsApi(scraper_api)
        refusal = _until_refused(lambda: custom.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
            {"metadata": {"annotations": {"team.example/owner": None}}}, dry_run="All"))
        assert refusal.status == 403
        assert "this request also changes annotation team.example/owner" in str(refusal.body)

        asyncio.run(write_stall_marker(scraper_api, namespace, trainjob, uid,
                                       "2026-12-03T12:00:00Z"))
        assert annotations() == {"team.example/owner": "alice",
                                 STALLED_SINCE_ANNOTATION: "2026-12-03T12:00:00Z"}
        asyncio.run(write_stall_marker(scraper_api, namespace, trainjob, uid, None))
        assert annotations() == {"team.example/owner": "alice"}
        # A TrainJob re-created under the name (another UID) is never marked.
        with pytest.raises(client.ApiException) as other:
            asyncio.run(write_stall_marker(scraper_api, namespace, trainjob, "other-uid",
                                           "2026-12-03T12:00:00Z"))
        assert other.value.status == 422 and "field is immutable" in str(other.value.body), \
            other.value.body
        # The spec stays the owner's, with or without the annotation in the same patch.
        spec = _refused(lambda: custom.patch_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
            {"metadata": {"annotations": {STALLED_SINCE_ANNOTATION: "x"}},
             "spec": {"suspend": True}}))
        assert spec is not None and spec.status == 403, spec
        assert "this request also changes spec" in str(spec.body), spec.body
    assert annotations() == {"team.example/owner": "alice"}


def test_without_stall_annotate_the_scraper_may_not_patch_trainjobs(
    control_plane: ControlPlane, kube_api: client.ApiClient, trainjob_crd: None,
    namespace: str, unmarked_release: Release,
) -> None:
    """config.stall.annotate=false (and statusTarget status): no `patch` on trainjobs,
    so the stalled-since write is refused by RBAC (the scraper logs it once; its Events
    and /metrics still say the training is stalled)."""
    trainjob = "hung"
    uid = objects.create_trainjob(kube_api, namespace, trainjob)["metadata"]["uid"]
    with control_plane.api_client_for_token(unmarked_release.token) as scraper_api, \
            pytest.raises(client.ApiException) as refused:
        asyncio.run(write_stall_marker(scraper_api, namespace, trainjob, uid,
                                       "2026-12-03T12:00:00Z"))
    assert refused.value.status == 403
    message = json.loads(refused.value.body)["message"]
    assert 'cannot patch resource "trainjobs"' in message, message
