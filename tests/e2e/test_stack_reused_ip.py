"""A reused pod IP on the real stack never delivers another TrainJob's status (issue 21,
input 2, the case of a pod watch behind).

Trainer -> JobSet -> Job -> pod -> scheduler -> kwok -> pod runner, as shipped: kwok
allocates pod IPs from the runner node's loopback podCIDR and hands a freed one to the
next pod, and every trainer serves on port 28080, so TrainJob B's new pod answers at
exactly the address where TrainJob A's pod answered.  The scraper talks to the API
server through the fault proxy (tests/helpers/fault_proxy.py), which cuts its pod watch
and holds the reconnection while A's pod goes and B's comes: the scraper still has A's
target at that address.  Before: B's status landed on A 0.9 s after B's exporter
answered, and stayed.  Now B's exporter states its pod (the pod runner gives it the
kubelet's HOSTNAME and the ServiceAccount mount's namespace file) and the scraper
writes none of it to A; once the watch catches up, B's status lands on B.

kwok hands out any free address of the node (its pool is a Go map: which one is random),
and the session's earlier pods left some free: before A's pod goes, filler pods take
every free address below the highest in use, so A's is the only one B's pod can get.
"""

from __future__ import annotations

import ipaddress
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes import client

from exporter_lib import DEFAULT_PORT
from exporter_lib.pod import POD_HEADER, PodIdentity, kubelet_hostname
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL
from localdev.cluster import trainjobs
from localdev.cluster.mounts import private_mount_prefix
from localdev.cluster.stack import RUNNER_NODE, RUNNER_TAINT_KEY, Cluster
from localdev.demo.processes import Child
from tests.helpers.fault_proxy import FaultProxy, write_kubeconfig
from tests.helpers.scraper import scraper_service_account
from tests.helpers.stack import recording, scraper, scraper_metric

TRAINER = str(Path(__file__).with_name("stack_trainer.py"))
TIMEOUT = 120.0
#: How long the scraper's pod watch is held behind: A's pod must go and B's start in it.
BEHIND_SECONDS = 60.0


def _command() -> list[str]:
    return [sys.executable, TRAINER, "--steps", "2000", "--step-seconds", "0.3"]


#: Filler pods at most (the session's pods on the runner node at once stay far below).
FILLERS_MAX = 64


def _offsets_in_use(api: client.ApiClient, cidr: str) -> set[int]:
    net = ipaddress.ip_network(cidr)
    pods = client.CoreV1Api(api).list_pod_for_all_namespaces(
        field_selector=f"spec.nodeName={RUNNER_NODE}").items
    return {int(ipaddress.ip_address(p.status.pod_ip)) - int(net.network_address)
            for p in pods if p.status.pod_ip
            and ipaddress.ip_address(p.status.pod_ip) in net}


@contextmanager
def _no_free_address_but_the_next(api: client.ApiClient, namespace: str,
                                  cidr: str) -> Iterator[None]:
    """Filler pods on the runner node until every address from the first to the highest
    in use is taken and the last two fillers got new ones; deleted on exit."""
    core = client.CoreV1Api(api)
    names: list[str] = []
    fresh = 0
    try:
        while len(names) < FILLERS_MAX:
            used = _offsets_in_use(api, cidr)
            if fresh >= 2 and used >= set(range(1, max(used) + 1)):
                break
            name = f"filler-{len(names)}"
            core.create_namespaced_pod(namespace, {"metadata": {"name": name}, "spec": {
                "nodeName": RUNNER_NODE, "terminationGracePeriodSeconds": 0,
                "tolerations": [{"key": RUNNER_TAINT_KEY, "operator": "Exists"}],
                "containers": [{"name": "sleep", "image": "filler",
                                "command": ["sleep", "600"]}]}})
            names.append(name)
            deadline = time.monotonic() + TIMEOUT
            while not (ip := core.read_namespaced_pod(name, namespace).status.pod_ip):
                assert time.monotonic() < deadline, f"filler {name} got no address"
                time.sleep(0.2)
            offset = (int(ipaddress.ip_address(ip))
                      - int(ipaddress.ip_network(cidr).network_address))
            fresh = fresh + 1 if offset > max(used, default=0) else 0
        else:
            raise AssertionError(f"{FILLERS_MAX} filler pods left free addresses")
        yield
    finally:
        for name in names:
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def _stated(address: str) -> PodIdentity | None:
    """The pod the exporter at ``address`` states in its answer."""
    with urllib.request.urlopen(f"http://{address}:{DEFAULT_PORT}/metrics",
                                timeout=10) as resp:
        return PodIdentity.parse(resp.headers.get(POD_HEADER))


def _wrong_pod_answers(child: Child) -> float:
    lines = scraper_metric(child, "trainjob_scraper_wrong_pod_answers_total")
    return sum(float(line.split()[-1]) for line in lines.splitlines() if line)


def test_reused_pod_ip_while_the_pod_watch_is_behind(
        kube_stack: Cluster, stack_api: client.ApiClient, stack_namespace: str,
        tmp_path: Path) -> None:
    ns = stack_namespace
    pods = rf"^/api/v1/namespaces/{ns}/pods"
    with (scraper_service_account(stack_api, kube_stack, ns) as token,
          FaultProxy(kube_stack.server_url, kube_stack.ca_cert_path) as proxy):
        kubeconfig = write_kubeconfig(tmp_path / "proxy.kubeconfig", proxy.url, token)
        with (scraper(kube_stack, ns, tmp_path, ["--backoff-max", "1s"],
                      kubeconfig=kubeconfig) as child,
              recording(stack_api, ns, "ipa") as rec_a, recording(stack_api, ns, "ipb") as rec_b):
            trainjobs.create(stack_api, trainjobs.trainjob_body(
                ns, "ipa", env={"RUN_ID": "ipa"}, command=_command()))
            rec_a.wait_for(lambda o: o.status is not None, TIMEOUT, "A's first status")
            [pod_a] = trainjobs.pods(stack_api, ns, "ipa")
            address = pod_a.status.pod_ip
            # The pod runner gives the container what a kubelet does (HOSTNAME, the
            # ServiceAccount mount), so the exporter names its pod: hostname and namespace.
            # (The ServiceAccount mount needs the pod runner's private mount namespace.)
            assert private_mount_prefix() is not None, (
                "no private mount namespace here: the pod runner mounts no ServiceAccount "
                "volume, so exporters cannot read their namespace")
            assert _stated(address) == PodIdentity(
                hostname=kubelet_hostname(pod_a.metadata.name, pod_a.spec.hostname),
                namespace=ns)

            with _no_free_address_but_the_next(stack_api, ns, kube_stack.runner_cidr):
                # The scraper's pod watch falls behind: cut, and its reconnection held.
                proxy.delay("GET", pods, BEHIND_SECONDS, times=3)
                assert proxy.end_watches(abort=False, path=pods) == 1
                behind = time.monotonic()
                client.CustomObjectsApi(stack_api).patch_namespaced_custom_object(
                    API_GROUP, API_VERSION, ns, TRAINJOB_PLURAL, "ipa", {"spec": {"suspend": True}})
                deadline = time.monotonic() + TIMEOUT
                while trainjobs.pods(stack_api, ns, "ipa") and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert not trainjobs.pods(stack_api, ns, "ipa"), "A's pod was not deleted"
                trainjobs.create(stack_api, trainjobs.trainjob_body(
                    ns, "ipb", env={"RUN_ID": "ipb"}, command=_command()))
                [pod_b] = trainjobs.wait_pods(stack_api, ns, "ipb", count=1, timeout=TIMEOUT)
                assert pod_b.status.pod_ip == address, (
                    f"kwok gave B's pod {pod_b.status.pod_ip}, not A's freed {address}")

                deadline = time.monotonic() + BEHIND_SECONDS
                while _wrong_pod_answers(child) < 3 and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert _wrong_pod_answers(child) >= 3, child.log_tail()
                assert time.monotonic() - behind < BEHIND_SECONDS, "the watch caught up first"
                # Once the watch catches up, B's pod is B's target.
                rec_b.wait_for(lambda o: o.status is not None, BEHIND_SECONDS + TIMEOUT,
                               "B's status on B")
                runs = {s.metrics_dict().get("run") for s in rec_a.statuses()}
                assert runs == {"ipa"}, f"another TrainJob's status landed on A: {runs}"
