"""``kubectl trainjob``: the real kubectl finds the plugin and runs it against the API server.

Every TrainJob here is created through the API and its status written by server-side
apply, as the scraper writes it; nothing relies on printer columns of our own CRD
(Trainer's CRD has only State and Age).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import time
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL, TrainerStatus, now
from localdev.cluster import objects
from localdev.cluster.controlplane import ControlPlane
from tests.helpers.client import PLUGIN_TIMEOUT_SECONDS, Kubectl, PluginDir, apply_status, condition
from trainjob_client.annotation import TRAINER_STATUS_ANNOTATION, encode_annotation


def status(percent: int, eta: int | None = 310, age_seconds: int = 0,
           **metrics: str) -> dict[str, object]:
    body: dict[str, object] = {
        "progressPercentage": percent,
        "lastUpdatedTime": (now() - timedelta(seconds=age_seconds)).isoformat(),
        "metrics": [{"name": k, "value": v} for k, v in metrics.items()],
    }
    if eta is not None:
        body["estimatedRemainingSeconds"] = eta
    return body


def cells(table: str) -> list[dict[str, str]]:
    """Rows of a kubectl-style table as {column: text}, by the header's column starts."""
    header, *rows = table.splitlines()
    titles = header.split()
    starts = [header.index(f"{t} " if i < len(titles) - 1 else t)
              for i, t in enumerate(titles)]
    ends = [*starts[1:], None]
    return [{t: row[s:e].strip() for t, s, e in zip(titles, starts, ends, strict=True)}
            for row in rows]


def test_kubectl_plugin_list_finds_the_console_script(control_plane: ControlPlane,
                                                      plugin_dir: PluginDir) -> None:
    result = subprocess.run([str(control_plane.kubectl_path), "plugin", "list"],
                            capture_output=True, text=True, env=plugin_dir.env(),
                            timeout=PLUGIN_TIMEOUT_SECONDS)
    assert str(plugin_dir.bin / "kubectl-trainjob") in result.stdout, (result.stdout,
                                                                       result.stderr)


def test_kubectl_runs_the_plugin_help(kubectl: Kubectl) -> None:
    result = kubectl("trainjob", "--help")
    assert result.returncode == 0, result.stderr
    assert "progress" in result.stdout and "watch" in result.stdout


def test_progress_table_shows_bar_eta_age_and_chosen_metrics(
        kubectl: Kubectl, kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    objects.create_trainjob(kube_api, namespace, "waiting")
    apply_status(kube_api, namespace, trainjob, trainerStatus=status(
        42, eta=310, age_seconds=12, loss="0.173", accuracy="0.91", lr="3e-05"))

    result = kubectl("trainjob", "progress", "-n", namespace, "--metrics", "loss,accuracy")
    assert result.returncode == 0, result.stderr
    rows = {r["NAME"]: r for r in cells(result.stdout)}
    assert list(rows) == ["train", "waiting"], result.stdout
    row = rows["train"]
    assert row["PROGRESS"].endswith("42%") and row["PROGRESS"].startswith("|"), row
    assert row["ETA"] == "5m10s"
    # Written 12 s ago; the plugin ran within a few seconds of that.
    assert 12 <= int(row["UPDATED"].rstrip("s")) < 60, row
    assert (row["LOSS"], row["ACCURACY"]) == ("0.173", "0.91")
    assert "LR" not in row, "only the metrics asked for are columns"
    assert rows["waiting"]["PROGRESS"] == "<none>"
    assert "Warning" not in result.stderr, "both metrics are reported"

    # A metric no TrainJob reports (a typo) is a column of <none> and a warning naming
    # what is reported (a newcomer saw only the <none>).
    typo = kubectl("trainjob", "progress", "-n", namespace, "--metrics", "los,loss")
    assert typo.returncode == 0, typo.stderr
    assert {r["NAME"]: r["LOS"] for r in cells(typo.stdout)} == {"train": "<none>",
                                                                "waiting": "<none>"}
    assert typo.stderr.strip() == ('Warning: no TrainJob shown reports metric "los" '
                                   "(metrics reported: accuracy, loss, lr)")
    # A name given twice is one column; one that differs only in case gets a hint.
    twice = kubectl("trainjob", "progress", "-n", namespace, "--metrics", "loss,loss",
                    "--metrics", "loss")
    assert twice.stdout.splitlines()[0].split().count("LOSS") == 1, twice.stdout
    upper = kubectl("trainjob", "progress", "-n", namespace, "--metrics", "Loss")
    assert upper.stderr.strip().endswith(
        'names are case-sensitive: did you mean "loss"?'), upper.stderr


def test_progress_all_namespaces_has_a_namespace_column(
        kubectl: Kubectl, kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    apply_status(kube_api, namespace, trainjob, trainerStatus=status(7))
    result = kubectl("trainjob", "progress", "-A")
    assert result.returncode == 0, result.stderr
    rows = [r for r in cells(result.stdout) if r["NAMESPACE"] == namespace]
    assert [(r["NAME"], r["PROGRESS"][-3:]) for r in rows] == [("train", " 7%")], result.stdout


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_progress_output_json_and_yaml_carry_the_api_status(
        kubectl: Kubectl, kube_api: client.ApiClient, namespace: str, trainjob: str,
        output: str) -> None:
    written = status(64, eta=90, loss="0.5")
    apply_status(kube_api, namespace, trainjob, trainerStatus=written)
    result = kubectl("trainjob", "progress", trainjob, "-n", namespace, "-o", output)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout) if output == "json" else yaml.safe_load(result.stdout)
    assert (data["namespace"], data["name"], data["source"]) == (
        namespace, trainjob, "status.trainerStatus")
    assert TrainerStatus.from_api(data["trainerStatus"]) == TrainerStatus.from_api(written)

    listed = kubectl("trainjob", "progress", "-n", namespace, "-o", output)
    items = (json.loads(listed.stdout) if output == "json"
             else yaml.safe_load(listed.stdout))["items"]
    assert [i["name"] for i in items] == [trainjob]


def test_progress_reads_the_annotation_on_a_trainer_before_v2_2(
        kubectl: Kubectl, kube_api: client.ApiClient, legacy_trainjob_crd: None,
        namespace: str) -> None:
    objects.create_trainjob(kube_api, namespace, "old")
    reported = TrainerStatus.from_api(status(55, eta=3600, loss="1.25"))
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, "old",
        {"metadata": {"annotations": {TRAINER_STATUS_ANNOTATION: encode_annotation(reported)}}})
    # The legacy CRD prunes status.trainerStatus: the annotation is the only place.
    pruned = client.CustomObjectsApi(kube_api).patch_namespaced_custom_object_status(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, "old",
        {"status": {"trainerStatus": status(99)}})
    assert "trainerStatus" not in pruned.get("status", {}), pruned

    result = kubectl("trainjob", "progress", "old", "-n", namespace, "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["source"] == f"metadata.annotations[{TRAINER_STATUS_ANNOTATION}]"
    assert TrainerStatus.from_api(data["trainerStatus"]) == reported

    table = kubectl("trainjob", "progress", "-n", namespace, "--metrics", "loss")
    (row,) = cells(table.stdout)
    assert (row["PROGRESS"][-3:], row["ETA"], row["LOSS"]) == ("55%", "60m", "1.25")


def test_progress_names_the_field_of_an_invalid_annotation(
        kubectl: Kubectl, kube_api: client.ApiClient, namespace: str, trainjob: str) -> None:
    bad = json.dumps({"progressPercentage": 101, "lastUpdatedTime": now().isoformat()})
    client.CustomObjectsApi(kube_api).patch_namespaced_custom_object(
        API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, trainjob,
        {"metadata": {"annotations": {TRAINER_STATUS_ANNOTATION: bad}}})
    result = kubectl("trainjob", "progress", trainjob, "-n", namespace)
    assert result.returncode == 1
    assert TRAINER_STATUS_ANNOTATION in result.stderr
    assert "progressPercentage=101" in result.stderr and "100" in result.stderr, result.stderr


def test_missing_trainjob_is_named_with_its_namespace(kubectl: Kubectl, trainjob_crd: None,
                                                      namespace: str) -> None:
    result = kubectl("trainjob", "progress", "nope", "-n", namespace)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f'error: TrainJob "nope" not found in namespace "{namespace}"')
    watched = kubectl("trainjob", "watch", "nope", "-n", namespace, "--timeout", "5")
    assert watched.returncode == 1 and "not found" in watched.stderr


def test_no_status_yet_says_where_it_looked(kubectl: Kubectl, namespace: str,
                                            trainjob: str) -> None:
    result = kubectl("trainjob", "progress", trainjob, "-n", namespace)
    assert result.returncode == 1
    assert f'TrainJob "{trainjob}" in namespace "{namespace}" has no trainer status yet' \
        in result.stderr
    assert "status.trainerStatus" in result.stderr and TRAINER_STATUS_ANNOTATION in \
        result.stderr


def test_forbidden_names_the_resource_namespace_and_identity(
        kubectl: Kubectl, control_plane: ControlPlane, namespace: str, trainjob: str,
        tmp_path: Path) -> None:
    token = control_plane.service_account_token(namespace, "viewer", expiration_seconds=600)
    kubeconfig = control_plane.kubeconfig_for_token(token, tmp_path / "viewer.kubeconfig")

    result = kubectl("trainjob", "progress", trainjob, "-n", namespace, kubeconfig=kubeconfig)
    assert result.returncode == 1
    assert result.stderr.startswith(
        f'error: no permission to get trainjobs.trainer.kubeflow.org "{trainjob}" in '
        f'namespace "{namespace}"'), result.stderr
    assert f"system:serviceaccount:{namespace}:viewer" in result.stderr

    listed = kubectl("trainjob", "progress", "-A", kubeconfig=kubeconfig)
    assert listed.returncode == 1
    assert "no permission to list trainjobs.trainer.kubeflow.org in all namespaces" in \
        listed.stderr, listed.stderr


def test_context_flag_and_its_namespace_are_used_like_kubectl(
        kubectl: Kubectl, control_plane: ControlPlane, kube_api: client.ApiClient,
        namespace: str, trainjob: str, tmp_path: Path) -> None:
    apply_status(kube_api, namespace, trainjob, trainerStatus=status(33))
    admin = yaml.safe_load(control_plane.kubeconfig_path.read_text())
    # Current context points at a closed port; --context picks the working one, whose
    # namespace is the default when -n is not given.
    admin["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9"}})
    admin["contexts"] = [
        {"name": "broken", "context": {"cluster": "nowhere", "user": "user"}},
        {"name": "work", "context": {"cluster": "devcluster", "user": "user",
                                     "namespace": namespace}},
    ]
    admin["current-context"] = "broken"
    path = tmp_path / "two-contexts.kubeconfig"
    path.write_text(yaml.safe_dump(admin))

    result = kubectl("trainjob", "progress", "--kubeconfig", str(path), "--context", "work")
    assert result.returncode == 0, result.stderr
    assert [r["NAME"] for r in cells(result.stdout)] == [trainjob]

    unknown = kubectl("trainjob", "progress", "--kubeconfig", str(path), "--context", "x")
    assert unknown.returncode == 1
    assert 'context "x" not found' in unknown.stderr and "broken, work" in unknown.stderr


def _read_line(proc: subprocess.Popen[str]) -> str:
    # Bounded: the watch itself gives up after its --timeout and closes stdout.
    assert proc.stdout is not None and proc.stderr is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"watch ended early (exit {proc.wait()}): {proc.stderr.read()}")
    return line.rstrip("\n")


def _watch(control_plane: ControlPlane, plugin_dir: PluginDir, *args: str,
           ) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(control_plane.kubectl_path), "trainjob", "watch", *args, "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=plugin_dir.env(KUBECONFIG=str(control_plane.kubeconfig_path)))


def test_watch_follows_each_change_until_100_percent(
        control_plane: ControlPlane, plugin_dir: PluginDir, kube_api: client.ApiClient,
        namespace: str, trainjob: str) -> None:
    proc = _watch(control_plane, plugin_dir, trainjob, "-n", namespace, "--metrics", "loss,acc")
    try:
        header = _read_line(proc)
        assert header.split()[:3] == ["NAME", "STATE", "PROGRESS"], header
        assert header.split()[-2:] == ["LOSS", "ACC"], header
        first = _read_line(proc)
        assert "<none>" in first, "no status yet is the first row"
        seen = []
        for percent, loss in ((10, "2.0"), (50, "1.0"), (100, "0.5")):
            apply_status(kube_api, namespace, trainjob,
                         trainerStatus=status(percent, eta=0 if percent == 100 else 60,
                                              loss=loss))
            line = _read_line(proc)
            seen.append(line)
            assert f"{percent:3d}%" in line and loss in line, line
        assert proc.wait(timeout=PLUGIN_TIMEOUT_SECONDS) == 0, proc.stderr.read()  # type: ignore[union-attr]
        # A --metrics name the TrainJob never reported during the watch: said at its end.
        assert proc.stderr.read().strip() == (  # type: ignore[union-attr]
            f'Warning: TrainJob "{trainjob}" never reported metric "acc" '
            "(metrics reported: loss)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watch_ends_on_failed_condition_with_its_exit_code(
        control_plane: ControlPlane, plugin_dir: PluginDir, kube_api: client.ApiClient,
        namespace: str, trainjob: str) -> None:
    apply_status(kube_api, namespace, trainjob, trainerStatus=status(20))
    proc = _watch(control_plane, plugin_dir, trainjob, "-n", namespace, "-o", "json")
    try:
        first = json.loads(_read_line(proc))
        assert first["trainerStatus"]["progressPercentage"] == 20
        apply_status(kube_api, namespace, trainjob, conditions=[condition("Failed")])
        last = json.loads(_read_line(proc))
        assert last["state"] == "Failed"
        assert proc.wait(timeout=PLUGIN_TIMEOUT_SECONDS) == 3
        assert "Failed" in proc.stderr.read()  # type: ignore[union-attr]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_watch_timeout_names_the_last_state(kubectl: Kubectl, kube_api: client.ApiClient,
                                            namespace: str, trainjob: str) -> None:
    apply_status(kube_api, namespace, trainjob, trainerStatus=status(30))
    started = time.monotonic()
    result = kubectl("trainjob", "watch", trainjob, "-n", namespace, "--timeout", "2")
    assert result.returncode == 1
    assert time.monotonic() - started < PLUGIN_TIMEOUT_SECONDS
    assert "did not end within --timeout=2s (last seen: 30%" in result.stderr, result.stderr


@pytest.mark.parametrize("columns", [120, 0], ids=["120-columns", "size-unknown"])
def test_watch_on_a_terminal_draws_a_live_bar(
        control_plane: ControlPlane, plugin_dir: PluginDir, kube_api: client.ApiClient,
        namespace: str, trainjob: str, columns: int) -> None:
    apply_status(kube_api, namespace, trainjob, trainerStatus=status(100, eta=0, loss="0.3"))
    # A pseudo-terminal, so the plugin sees a TTY as in an interactive shell.
    leader, follower = pty.openpty()
    # A window's size, or none (a fresh pty reports 0 x 0, as some CI runners do).
    fcntl.ioctl(follower, termios.TIOCSWINSZ,
                struct.pack("HHHH", 24 if columns else 0, columns, 0, 0))
    try:
        proc = subprocess.Popen(
            [str(control_plane.kubectl_path), "trainjob", "watch", trainjob, "-n", namespace,
             "--metrics", "loss", "--timeout", "60"],
            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
            env=plugin_dir.env(KUBECONFIG=str(control_plane.kubeconfig_path)))
        os.close(follower)
        follower = -1
        assert proc.wait(timeout=PLUGIN_TIMEOUT_SECONDS) == 0
        drawn = b""
        while select.select([leader], [], [], 1)[0]:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
        if follower != -1:
            os.close(follower)
    text = drawn.decode(errors="replace")
    assert "\r" in text, "a tqdm bar redraws in place"
    assert f"{trainjob}: 100%|" in text and "ETA 00:00" in text and "loss=0.3" in text, text
