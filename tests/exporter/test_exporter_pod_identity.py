"""Every exporter answer states which pod answers (issue 21, input 2).

A real exporter process with the environment a pod gives it (``HOSTNAME`` from the
container runtime, downward API variables when the spec sets them) puts
``Trainjob-Exporter-Pod`` on every answer, whatever the route or status; outside a pod
it states nothing rather than the machine's name.  The header's syntax round-trips
(hypothesis) and the kubelet's hostname rule is the one the scraper compares with.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporter_lib.pod import (
    HOSTNAME_MAX,
    POD_HEADER,
    PodIdentity,
    hostname_label,
    kubelet_hostname,
    pod_identity,
    service_account_namespace,
)

EXPORTER = r"""
import sys, time
import exporter_lib
exp = exporter_lib.start(host="127.0.0.1", port=0, install_signal_handler=False)
print(exp.port, flush=True)
time.sleep(60)
"""
_POD_ENV = ("HOSTNAME", "POD_NAME", "POD_UID", "POD_NAMESPACE", "KUBERNETES_SERVICE_HOST")
UID = "5f0e3c1a-9b7d-4c2e-8f6a-1d2b3c4d5e6f"


def _start(env: dict[str, str]) -> tuple[subprocess.Popen[str], int]:
    base = {k: v for k, v in os.environ.items() if k not in _POD_ENV}
    child = subprocess.Popen([sys.executable, "-c", EXPORTER], stdout=subprocess.PIPE,
                             text=True, env={**base, "RANK": "0", **env})
    assert child.stdout is not None
    return child, int(child.stdout.readline())


def _headers(port: int, request: bytes) -> dict[str, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    head = answer.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    return {"status": head[0], **{k.lower(): v.strip() for k, _, v in
                                  (line.partition(":") for line in head[1:])}}


@pytest.fixture
def in_pod() -> Iterator[int]:
    child, port = _start({"HOSTNAME": "tj-node-0-0", "POD_NAME": "tj-node-0-0-x7k2q",
                          "POD_NAMESPACE": "team-a", "POD_UID": UID})
    yield port
    child.kill()
    child.wait(10)


@pytest.mark.parametrize("request_bytes", [
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/json\r\n\r\n",  # 204
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n",  # 404
    b"GET /metrics HTTP/1.1\r\n\r\n",  # 400: no Host
    b"POST /apis/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",  # refused push
])
def test_every_answer_states_the_pod(in_pod: int, request_bytes: bytes) -> None:
    headers = _headers(in_pod, request_bytes)
    stated = PodIdentity.parse(headers.get(POD_HEADER.lower()))
    assert stated == PodIdentity("tj-node-0-0", "tj-node-0-0-x7k2q", "team-a", UID), headers


def test_outside_a_pod_nothing_is_stated() -> None:
    child, port = _start({})
    try:
        headers = _headers(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert headers["status"].startswith("HTTP/1.1 200")
        assert POD_HEADER.lower() not in headers
    finally:
        child.kill()
        child.wait(10)


def test_gethostname_only_inside_a_pod() -> None:
    assert pod_identity({}, gethostname=lambda: "vm") == PodIdentity()
    assert pod_identity({"KUBERNETES_SERVICE_HOST": "10.0.0.1"},
                        gethostname=lambda: "tj-node-0-1") == PodIdentity("tj-node-0-1")
    # The runtime's HOSTNAME wins over the UTS name; unsafe characters are left out.
    assert pod_identity({"HOSTNAME": "a-0", "POD_UID": 'x"y'},
                        gethostname=lambda: "b") == PodIdentity("a-0")


_names = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,60}[a-z0-9])?", fullmatch=True)


@given(hostname=st.none() | _names, name=st.none() | _names,
       namespace=st.none() | _names, uid=st.none() | st.uuids().map(str))
def test_header_round_trips(hostname: str | None, name: str | None,
                            namespace: str | None, uid: str | None) -> None:
    identity = PodIdentity(hostname, name, namespace, uid)
    header = identity.header()
    if header is None:
        assert identity == PodIdentity()
    else:
        assert PodIdentity.parse(header) == identity
        # A later exporter may add members of any RFC 8941 type, and parameters: ignored.
        for extra in (', zone="x"', ', version="1.2 beta"', ", v=2", ", flag", ";x=1"):
            assert PodIdentity.parse(header + extra) == identity, extra


def test_the_namespace_comes_from_the_service_account_mount(tmp_path: Path) -> None:
    """JobSet hostnames carry no namespace and the runtimes set no POD_NAMESPACE: the
    ServiceAccount mount's namespace file tells same-named pods of two namespaces apart
    (a newcomer's run wrote nc-b/same's status to nc-a/same before this)."""
    file = tmp_path / "namespace"
    file.write_text("team-b\n")
    read = lambda: service_account_namespace(file)  # noqa: E731
    assert pod_identity({"HOSTNAME": "same-node-0-0"}, namespace_file=read) == PodIdentity(
        "same-node-0-0", namespace="team-b")
    # The downward API's value, when set, wins.
    assert pod_identity({"HOSTNAME": "a", "POD_NAMESPACE": "team-a"},
                        namespace_file=read).namespace == "team-a"
    assert pod_identity({}, namespace_file=lambda: None) == PodIdentity()


@given(st.text(max_size=80))
def test_malformed_headers_state_nothing(text: str) -> None:
    parsed = PodIdentity.parse(text)
    assert parsed is None or parsed.header() is not None


@given(name=st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,250}[a-z0-9])?", fullmatch=True))
def test_kubelet_hostname_rule(name: str) -> None:
    got = kubelet_hostname(name)
    assert len(got) <= HOSTNAME_MAX
    if len(name) <= HOSTNAME_MAX:
        assert got == name
    else:
        assert got == name[:HOSTNAME_MAX].rstrip("-.") and not got.endswith(("-", "."))
    assert kubelet_hostname(name, "given") == "given"
    assert hostname_label(f"{got}.sub.ns.svc.cluster.local") == hostname_label(got)
