"""RBAC with ServiceAccount tokens, label-selector watches, pod objects."""

from __future__ import annotations

import time

import pytest
from kubernetes import client, watch

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import objects
from localdev.cluster.controlplane import ControlPlane

RANK0_SELECTOR = (
    "jobset.sigs.k8s.io/jobset-name,"
    "jobset.sigs.k8s.io/replicatedjob-name in (node, launcher),"
    "jobset.sigs.k8s.io/job-index=0,"
    "batch.kubernetes.io/job-completion-index=0"
)


def grant_trainjob_reader(api: client.ApiClient, namespace: str, sa: str) -> None:
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, {
        "metadata": {"name": "trainjob-reader"},
        "rules": [{"apiGroups": [API_GROUP], "resources": [TRAINJOB_PLURAL],
                   "verbs": ["get", "list", "watch"]}],
    })
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "trainjob-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "trainjob-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    })


@pytest.mark.usefixtures("trainjob_crd")
def test_service_account_denied_until_role_binding(control_plane: ControlPlane,
                                                   kube_api: client.ApiClient,
                                                   namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "guarded")
    token = control_plane.service_account_token(namespace, "scraper")

    with control_plane.api_client_for_token(token) as restricted:
        custom = client.CustomObjectsApi(restricted)
        with pytest.raises(client.ApiException) as caught:
            custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                                TRAINJOB_PLURAL, "guarded")
        assert caught.value.status == 403
        assert f"system:serviceaccount:{namespace}:scraper" in caught.value.body

        grant_trainjob_reader(kube_api, namespace, "scraper")

        # The authorizer reads RBAC objects from an informer: allow a moment.
        deadline = time.monotonic() + 10
        while True:
            try:
                got = custom.get_namespaced_custom_object(API_GROUP, API_VERSION, namespace,
                                                          TRAINJOB_PLURAL, "guarded")
                break
            except client.ApiException as exc:
                if exc.status != 403 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert got["metadata"]["name"] == "guarded"
        # Only what was granted: writing status is still forbidden.
        with pytest.raises(client.ApiException) as caught:
            custom.patch_namespaced_custom_object_status(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, "guarded",
                {"status": {}})
        assert caught.value.status == 403


@pytest.mark.usefixtures("trainjob_crd")
def test_kubectl_as_service_account(control_plane: ControlPlane, kube_api: client.ApiClient,
                                    namespace: str) -> None:
    token = control_plane.service_account_token(namespace, "viewer", expiration_seconds=600)

    denied = control_plane.kubectl("get", "trainjobs", "-n", namespace, token=token,
                                   check=False)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr

    whoami = control_plane.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}",
                                   token=token)
    assert whoami.stdout == f"system:serviceaccount:{namespace}:viewer"


@pytest.mark.usefixtures("trainjob_crd")
def test_label_selector_watch_delivers_added_modified_deleted(
        kube_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    start_rv = core.list_namespaced_pod(namespace).metadata.resource_version
    objects.create_trainjob(kube_api, namespace, "watched")

    rank0 = objects.create_trainer_pod(kube_api, namespace, "watched", port=28080)
    other = objects.create_trainer_pod(kube_api, namespace, "watched", port=28080, rank0=False)
    objects.terminate_pod(kube_api, namespace, rank0.metadata.name, '{"progressPercentage":100}')
    objects.delete_pod(kube_api, namespace, rank0.metadata.name)

    # Watching from the resource version before the changes replays all of them.
    events: list[tuple[str, str, str]] = []
    watcher = watch.Watch()
    for event in watcher.stream(core.list_namespaced_pod, namespace,
                                label_selector=RANK0_SELECTOR, resource_version=start_rv,
                                timeout_seconds=5):
        pod = event["object"]
        events.append((event["type"], pod.metadata.name, pod.status.phase))
        if event["type"] == "DELETED":
            watcher.stop()

    names = {name for _, name, _ in events}
    assert names == {rank0.metadata.name}, f"{other.metadata.name} must not match"
    kinds = [kind for kind, _, _ in events]
    assert kinds[0] == "ADDED"
    assert "MODIFIED" in kinds
    assert kinds[-1] == "DELETED"
    assert ("MODIFIED", rank0.metadata.name, "Succeeded") in events


@pytest.mark.usefixtures("trainjob_crd")
def test_trainer_pod_has_labels_ip_and_owner_chain(kube_api: client.ApiClient,
                                                   namespace: str) -> None:
    trainjob = objects.create_trainjob(kube_api, namespace, "chain")

    pod = objects.create_trainer_pod(kube_api, namespace, "chain", port=31234, ip="127.0.0.1",
                                     annotations={"trainjob-progress.dev/interval": "5s"})

    assert pod.status.phase == "Running"
    assert pod.status.pod_ip == "127.0.0.1"
    assert pod.status.container_statuses[0].state.running is not None
    labels = pod.metadata.labels
    assert labels["jobset.sigs.k8s.io/jobset-name"] == "chain"
    assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
    assert labels["jobset.sigs.k8s.io/job-index"] == "0"
    assert labels["batch.kubernetes.io/job-completion-index"] == "0"
    assert pod.metadata.annotations["trainjob-progress.dev/port"] == "31234"
    assert pod.metadata.annotations["trainjob-progress.dev/interval"] == "5s"
    listed = client.CoreV1Api(kube_api).list_namespaced_pod(namespace,
                                                           label_selector=RANK0_SELECTOR)
    assert [p.metadata.name for p in listed.items] == [pod.metadata.name]

    # Pod -> Job -> JobSet -> TrainJob, each a controller reference.
    (job_ref,) = pod.metadata.owner_references
    assert (job_ref.kind, job_ref.controller) == ("Job", True)
    job = client.BatchV1Api(kube_api).read_namespaced_job(job_ref.name, namespace)
    assert job.metadata.uid == job_ref.uid
    (jobset_ref,) = job.metadata.owner_references
    assert jobset_ref.kind == "JobSet"
    jobset = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
        objects.JOBSET_GROUP, objects.JOBSET_VERSION, namespace, objects.JOBSET_PLURAL,
        jobset_ref.name)
    (trainjob_ref,) = jobset["metadata"]["ownerReferences"]
    assert trainjob_ref["kind"] == "TrainJob"
    assert trainjob_ref["uid"] == trainjob["metadata"]["uid"]


@pytest.mark.usefixtures("trainjob_crd")
def test_terminate_pod_writes_termination_message(kube_api: client.ApiClient,
                                                  namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "ending")
    pod = objects.create_trainer_pod(kube_api, namespace, "ending", port=28080)

    failed = objects.terminate_pod(kube_api, namespace, pod.metadata.name, "final words",
                                   exit_code=3)

    assert failed.status.phase == "Failed"
    (state,) = [s.state.terminated for s in failed.status.container_statuses]
    assert (state.exit_code, state.message, state.reason) == (3, "final words", "Error")


@pytest.mark.usefixtures("trainjob_crd")
def test_delete_trainjob_cascades(kube_api: client.ApiClient, namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "gone")
    objects.create_trainer_pod(kube_api, namespace, "gone", port=28080)

    objects.delete_trainjob(kube_api, namespace, "gone")

    assert client.CoreV1Api(kube_api).list_namespaced_pod(namespace).items == []
    assert client.BatchV1Api(kube_api).list_namespaced_job(namespace).items == []
    with pytest.raises(client.ApiException) as caught:
        client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, "gone")
    assert caught.value.status == 404
