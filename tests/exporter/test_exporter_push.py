"""Push compatibility: the real Kubeflow SDK and raw requests against the exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubeflow.trainer import update_trainjob_status

import exporter_lib
from exporter_lib import api
from exporter_lib.push import MAX_BODY_BYTES, status_path

Fetch = Callable[..., Any]


def _post(fetch: Fetch, url: str, payload: Any, token: str | None, raw: bytes | None = None,
          content_type: str = "application/json") -> Any:
    headers = {"Content-Type": content_type}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = raw if raw is not None else json.dumps(payload).encode()
    return fetch(url, method="POST", headers=headers, body=body)


def _token() -> str:
    with open(os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"]) as handle:
        return handle.read().strip()


def test_kubeflow_sdk_update_trainjob_status_reaches_exporter(exporter: api.Exporter) -> None:
    url = exporter_lib.enable_push_compat(namespace="team-a", name="job-1")
    assert url == f"{exporter.url}{status_path('team-a', 'job-1')}"
    assert url.startswith("http://127.0.0.1:")
    assert oct(os.stat(os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"]).st_mode & 0o777) == "0o600"
    sent = update_trainjob_status(progress_percent=55, estimated_remaining_seconds=120,
                                  metrics={"loss": 0.3125, "epoch": 2, "phase": "train"})
    assert sent is True
    status = exporter_lib.current_status()
    assert status is not None
    assert status.progress_percentage == 55 and status.estimated_remaining_seconds == 120
    assert status.metrics_dict() == {"loss": "0.3125", "epoch": "2", "phase": "train"}


def test_push_errors_are_kubernetes_status(exporter: api.Exporter, fetch: Fetch) -> None:
    url = exporter.url + status_path("ns", "job")
    refused = _post(fetch, url, {"trainerStatus": {}}, token="x")
    assert refused.status == 403  # push compat not enabled: no token configured
    exporter_lib.enable_push_compat()
    token = _token()
    cases = [
        (_post(fetch, url, {"trainerStatus": {}}, token="wrong"), 401, "Unauthorized"),
        (_post(fetch, url, {"trainerStatus": {}}, token=None), 401, "Unauthorized"),
        (_post(fetch, url, None, token, raw=b"{not json"), 400, "BadRequest"),
        (_post(fetch, url, {"status": {}}, token), 400, "BadRequest"),
        (_post(fetch, url, {}, token, content_type="text/plain"), 415, "UnsupportedMediaType"),
        (_post(fetch, url, None, token, raw=b" " * (MAX_BODY_BYTES + 1)), 413,
         "RequestEntityTooLarge"),
        (_post(fetch, exporter.url + "/apis/other", {}, token), 404, "NotFound"),
    ]
    for resp, code, reason in cases:
        assert resp.status == code, (code, resp.body)
        body = json.loads(resp.body)
        assert body["kind"] == "Status" and body["apiVersion"] == "v1"
        assert body["status"] == "Failure" and body["code"] == code and body["reason"] == reason
    invalid = _post(fetch, url, {"trainerStatus": {
        "progressPercentage": 101, "lastUpdatedTime": "2025-01-01T00:00:00Z",
        "metrics": [{"name": "x" * 65, "value": "1"}]}}, token)
    assert invalid.status == 422
    body = json.loads(invalid.body)
    assert body["reason"] == "Invalid"
    fields = {c["field"] for c in body["details"]["causes"]}
    assert fields == {"trainerStatus.progressPercentage", "trainerStatus.metrics[0].name"}
    assert "101" in body["message"] and "100" in body["message"]
    assert exporter_lib.current_status() is None  # nothing applied


def test_push_replaces_whole_status(exporter: api.Exporter, fetch: Fetch) -> None:
    exporter_lib.update(progress_percentage=10, metrics={"old": 1})
    exporter_lib.enable_push_compat()
    resp = _post(fetch, os.environ["KUBEFLOW_TRAINER_SERVER_URL"], {"trainerStatus": {
        "progressPercentage": 20, "lastUpdatedTime": "2025-01-01T00:00:00.5+00:00",
        "metrics": [{"name": "loss", "value": "0.50"}]}}, _token())
    assert resp.status == 200
    status = exporter_lib.current_status()
    assert status is not None and status.progress_percentage == 20
    assert status.metrics_dict() == {"loss": "0.50"}  # exactly as pushed
    assert json.loads(resp.body)["trainerStatus"]["progressPercentage"] == 20


def test_push_answer_is_what_was_stored_and_needs_no_client_time(
        exporter: api.Exporter, fetch: Fetch) -> None:
    """lastUpdatedTime is the arrival time: a push may leave it out, and the 200 answer
    carries the kept time, not the client's."""
    exporter_lib.enable_push_compat()
    url = os.environ["KUBEFLOW_TRAINER_SERVER_URL"]
    before = datetime.now(UTC).replace(microsecond=0)
    for pushed in ({"progressPercentage": 30},
                   {"progressPercentage": 31, "lastUpdatedTime": "2020-01-01T00:00:00Z"}):
        resp = _post(fetch, url, {"trainerStatus": pushed}, _token())
        assert resp.status == 200, resp.body
        answered = json.loads(resp.body)["trainerStatus"]
        status = exporter_lib.current_status()
        assert status is not None and status.progress_percentage == pushed["progressPercentage"]
        assert answered == status.to_api()
        assert before <= status.last_updated_time <= datetime.now(UTC)


def test_generated_token_file_is_removed_at_exit() -> None:
    code = (
        "import os, exporter_lib\n"
        "exporter_lib.start(port=0, host='127.0.0.1')\n"
        "exporter_lib.enable_push_compat()\n"
        "path = os.environ['KUBEFLOW_TRAINER_SERVER_TOKEN']\n"
        "assert os.stat(path).st_mode & 0o777 == 0o600\n"
        "print(path)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    path = result.stdout.strip()
    assert path.endswith(".token")
    assert not os.path.exists(path)


def test_refused_pushes_with_a_body_get_their_answer_not_a_reset(
        exporter: api.Exporter, fetch: Fetch) -> None:
    # The server refuses before reading the body; unless it drains what the client is
    # still sending, closing resets the connection and the client sees a broken pipe.
    exporter_lib.enable_push_compat()
    url = exporter.url + status_path("ns", "job")
    body = b" " * (MAX_BODY_BYTES + 1)
    codes = [_post(fetch, url, None, token, raw=body).status
             for token in ("wrong", _token()) for _ in range(40)]
    assert codes == [401] * 40 + [413] * 40


def test_push_naming_another_trainjob_is_refused(exporter: api.Exporter, fetch: Fetch) -> None:
    """Issue 13, input 14: any path was accepted before."""
    exporter_lib.enable_push_compat(namespace="team-a", name="job-1")
    status = {"trainerStatus": {"progressPercentage": 5,
                                "lastUpdatedTime": "2025-01-01T00:00:00Z"}}
    for namespace, name in (("team-z", "victim"), ("team-a", "victim"), ("team-z", "job-1")):
        resp = _post(fetch, exporter.url + status_path(namespace, name), status, _token())
        assert resp.status == 403, resp.body
        body = json.loads(resp.body)
        assert body["reason"] == "Forbidden" and "team-a/job-1" in body["message"]
    assert exporter_lib.current_status() is None
    ok = _post(fetch, exporter.url + status_path("team-a", "job-1"), status, _token())
    assert ok.status == 200


def test_pod_trainjob_from_what_the_pod_is_told(tmp_path: Any) -> None:
    from exporter_lib.identity import pod_trainjob

    missing = str(tmp_path / "none")
    ns_file = tmp_path / "namespace"
    ns_file.write_text("team-a\n")
    assert pod_trainjob({}, missing).name is None
    told = pod_trainjob({"TRAINJOB_NAME": "job-1"}, str(ns_file))
    assert (told.namespace, told.name, told.source) == ("team-a", "job-1", "TRAINJOB_NAME")
    upstream = pod_trainjob({"KUBEFLOW_TRAINER_SERVER_URL":
                             "https://trainer.kubeflow-system.svc:8443" +
                             status_path("team-b", "job-2")}, missing)
    assert (upstream.namespace, upstream.name) == ("team-b", "job-2")
    torch = pod_trainjob({"PET_MASTER_ADDR": "job-3-node-0-0.job-3", "POD_NAMESPACE": "c"},
                         missing)
    assert (torch.namespace, torch.name, torch.source) == ("c", "job-3", "PET_MASTER_ADDR")
    assert pod_trainjob({"PET_MASTER_ADDR": "other-node-0-0.job-3"}, missing).name is None
    assert pod_trainjob({"TRAINJOB_NAME": "Not A Name!"}, missing).name is None
