"""Shared fixtures: a real local Kubernetes control plane and TrainJob CRDs.

The control plane (etcd + kube-apiserver built from the Go modules under
``tools/controlplane/``) starts once per session.  A test that needs it fails,
with the reason, when it cannot start: it is never skipped.  The first run
builds the binaries, which takes many minutes (progress is shown live).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from kubernetes import client

from localdev.cluster import objects
from localdev.cluster.assets import AssetsError
from localdev.cluster.controlplane import ControlPlane, ControlPlaneError
from localdev.cluster.crds import FLAVOUR_CURRENT, FLAVOUR_LEGACY, CrdError, install_trainjob_crds
from localdev.cluster.stack import Cluster
from tests.helpers import waits, xdist_groups
from tests.helpers.stack import started, started_cluster

# The tests' exporters run outside pods (in this process or its children; pods of the
# pod runner get theirs from it).  A HOSTNAME a CI container exports would be stated as
# their pod's hostname (exporter_lib/pod.py) and make the scraper refuse them.
os.environ.pop("HOSTNAME", None)

# Property tests (docs/testing.md, "Property tests"): the same examples on every run of
# `make test` and CI ("ci", the default), so a red run is a change of the code or the
# test, never a new draw; `make explore` draws many more, new ones each run, and keeps
# failures in .hypothesis/ to replay.  No deadline and no too_slow health check in
# either: they time the machine (a shared or loaded one fails them), not the property.
settings.register_profile("ci", derandomize=True, database=None, deadline=None,
                          print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", max_examples=2000, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")  # pytest --hypothesis-profile=explore loads the other

_FOLDER_MARKERS = ("e2e", "chart", "exporter", "scraper", "client", "controlplane",
                   "packaging", "benchmarks", "image")

#: The session fixtures that are local clusters with controllers.
_CLUSTER_FIXTURES = ("kube_stack", "push_stack", "kueue_stack", "legacy_stack")
#: What starts a cluster: a test using one of these (itself or through another fixture)
#: is marked ``cluster``.
_CLUSTER_STARTERS = ("control_plane", *_CLUSTER_FIXTURES)
#: Folders whose every test runs a cluster: on a fixture, or its own (in the test, or
#: in a child process such as the demo's).
_CLUSTER_FOLDERS = ("e2e", "image")
#: Fixtures grouped like the clusters, though they run no cluster: ``captures`` runs ten
#: real trainings (about 40 s: once, in one worker); ``plugin_dir`` (tests/client) and
#: ``wheel`` (tests/packaging) build the checkout's wheel, and setuptools writes build/
#: and the egg-info into the checkout: two builds at once in two workers broke each
#: other (seen with 3 workers), so both are in one group.
_GROUPED_FIXTURES = (*_CLUSTER_FIXTURES, "captures", "plugin_dir", "wheel")
#: Grouped fixtures that always share a group (a resource they both use).
_SAME_GROUP = (("plugin_dir", "wheel"),)


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist workers (``-n N``), schedule by the groups below
    (:mod:`tests.helpers.xdist_groups`)."""
    if (config.pluginmanager.hasplugin("xdist") and config.getoption("dist") != "no"
            and not hasattr(config, "workerinput")):
        config.pluginmanager.register(xdist_groups.GroupsPlugin(), "trainjob-xdist-groups")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test by its folder (``-m e2e``, ``-m "not chart"``), and ``cluster``
    when it runs a local cluster or control plane (``make check`` runs ``not cluster``).

    Each test on a local cluster joins the group of its cluster, so that under
    pytest-xdist every cluster starts in one worker only; tests that use two clusters
    join both into one group.  The same for :data:`_GROUPED_FIXTURES`.
    Selection and placement only: nothing is skipped, and a test's fixtures are the
    same in any worker.
    """
    groups = _cluster_groups(config, items)
    placed: dict[str, str] = {}
    for item in items:
        folder = item.path.relative_to(item.config.rootpath / "tests").parts[0]
        if folder in _FOLDER_MARKERS:
            item.add_marker(folder)
        if folder in _CLUSTER_FOLDERS or set(_CLUSTER_STARTERS) & set(item.fixturenames):
            item.add_marker("cluster")
        used = [name for name in _GROUPED_FIXTURES if name in item.fixturenames]
        if used:
            placed[item.nodeid] = groups[used[0]]
    xdist_groups.write_groups(config, placed)


def _cluster_groups(config: pytest.Config, items: list[pytest.Item]) -> dict[str, str]:
    """Each grouped fixture's group: the fixtures some test uses together share
    one (connected components, named by their fixtures)."""
    parent = {name: name for name in _GROUPED_FIXTURES}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    def join(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    if config.getoption("push"):  # push_stack is then kube_stack itself
        join("push_stack", "kube_stack")
    for a, b in _SAME_GROUP:
        join(a, b)
    for item in items:
        used = [name for name in _GROUPED_FIXTURES if name in item.fixturenames]
        for other in used[1:]:
            join(used[0], other)
    members: dict[str, list[str]] = {}
    for name in _GROUPED_FIXTURES:
        members.setdefault(root(name), []).append(name)
    return {name: "+".join(members[root(name)]) for name in _GROUPED_FIXTURES}


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Keep each phase's report on the item (``item.rep_setup``, ``rep_call``,
    ``rep_teardown``), so a fixture's teardown can tell whether its test failed
    (e.g. to print the scraper logs only then)."""
    rep = yield
    setattr(item, "rep_" + rep.when, rep)
    return rep


@pytest.fixture(autouse=True)
def _cluster_still_whole(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test on a local cluster, check that all of it still runs (every process,
    and the pod runner's loop).  If not, the test errors with the part's log, and the
    part is started again: one broken part must not fail every later test silently
    (seen: the pod runner gone mid-session, eleven later tests without a status)."""
    yield
    broken = []
    for name in _CLUSTER_FIXTURES:
        if name not in request.fixturenames:
            continue
        cluster: Cluster = request.getfixturevalue(name)
        try:
            cluster.check_running()
        except ControlPlaneError as exc:
            restarted = cluster.restart_stopped()
            broken.append(f"{name}: {exc}\nstarted again: {', '.join(restarted) or 'none'}")
    if broken:
        pytest.fail("a part of the local cluster stopped during this test:\n"
                    + "\n".join(broken))


@pytest.fixture(scope="session")
def control_plane(pytestconfig: pytest.Config) -> Iterator[ControlPlane]:
    """The session's running :class:`ControlPlane` (admin kubeconfig, tokens, kubectl)."""
    yield from started(pytestconfig, ControlPlane(), "local control plane",
                       (AssetsError, ControlPlaneError, OSError))


def _admin_api(cluster: ControlPlane | Cluster) -> Iterator[client.ApiClient]:
    """An admin ApiClient for ``cluster``, closed after its fixture's scope."""
    api = cluster.api_client()
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> Iterator[client.ApiClient]:
    """An admin ApiClient for the session's control plane."""
    yield from _admin_api(control_plane)


@pytest.fixture(scope="session")
def trainjob_crd(kube_api: client.ApiClient) -> None:
    """The current TrainJob CRD (with status.trainerStatus) and the JobSet CRD, installed."""
    try:
        install_trainjob_crds(kube_api)
    except CrdError as exc:
        pytest.fail(f"TrainJob CRDs could not be installed: {exc}", pytrace=False)


@pytest.fixture
def legacy_trainjob_crd(kube_api: client.ApiClient, trainjob_crd: None) -> Iterator[None]:
    """The TrainJob CRD of Trainer releases without trainerStatus, for this test only.

    The current CRD is restored afterwards, also when the test fails.
    """
    try:
        install_trainjob_crds(kube_api, legacy=True)
        yield
    finally:
        install_trainjob_crds(kube_api, legacy=False)


def _namespace_name(test_name: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"t-{base}-{secrets.token_hex(3)}"


def _created_namespace(api: client.ApiClient, request: pytest.FixtureRequest) -> str:
    """A new namespace named after the test (labelled as a test's); its name."""
    name = _namespace_name(request.node.name)
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=name, labels={"trainjob-progress.dev/test": "true"})))
    return name


@pytest.fixture
def namespace(kube_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace for this test; its pods, Jobs and TrainJobs are deleted after.

    The namespace itself is left in place: without a namespace controller its
    deletion would never finish.
    """
    name = _created_namespace(kube_api, request)
    try:
        yield name
    finally:
        _empty_namespace(kube_api, name)


def _empty_namespace(kube_api: client.ApiClient, name: str) -> None:
    # Best effort: a broken control plane must not hide the test's own failure.
    with contextlib.suppress(client.ApiException, OSError):
        custom = client.CustomObjectsApi(kube_api)
        trainjobs: dict[str, Any] = {"items": []}
        with contextlib.suppress(client.ApiException):
            trainjobs = custom.list_namespaced_custom_object(
                "trainer.kubeflow.org", "v1alpha1", name, "trainjobs")
        for item in trainjobs["items"]:
            objects.delete_trainjob(kube_api, name, item["metadata"]["name"])
        for pod in client.CoreV1Api(kube_api).list_namespaced_pod(name).items:
            objects.delete_pod(kube_api, name, pod.metadata.name)


# ----------------------------------------------------------------- the real stack


def _deleted_namespace(api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named after the test, deleted after it (on a cluster with
    controllers: the namespace controller and the garbage collector remove its objects)."""
    name = _created_namespace(api, request)
    try:
        waits.default_service_account(api, name)
        yield name
    finally:
        with contextlib.suppress(client.ApiException, OSError):
            client.CoreV1Api(api).delete_namespace(name)


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--push``: the session's local cluster (:func:`kube_stack`) runs with the
    Trainer's TrainJobStatus gate on (its status server serving), as ``make demo
    ARGS=--push`` does; the push tests use :func:`push_stack` either way."""
    parser.addoption("--push", action="store_true", default=False,
                     help="run the session's local cluster with Trainer's TrainJobStatus gate on")


@pytest.fixture(scope="session")
def kube_stack(pytestconfig: pytest.Config,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The session's local cluster with its controllers (:class:`localdev.cluster.stack.Cluster`).

    Its own API server, separate from :func:`control_plane` (whose hand-made
    objects the controllers would reconcile).  Flavour "v2.2-and-later" (Trainer
    v2.3.0); tests of the "before-v2.2" flavour use :func:`legacy_stack`.
    With ``--push`` it is started with ``push=True``.

    It starts with ``TMPDIR`` set to a directory of its own, as a user's may be: the
    Trainer's webhook server reads its certificate under Go's temporary directory, and
    the stack must start whatever the caller's is
    (:data:`localdev.cluster.stack.TRAINER_TMPDIR`); every test on this cluster then
    needs that webhook to admit its TrainJobs.
    """
    stack = started_cluster(pytestconfig, Cluster(flavour=FLAVOUR_CURRENT,
                                                  push=pytestconfig.getoption("push")))
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TMPDIR", str(tmp_path_factory.mktemp("callers-tmpdir")))
        cluster = next(stack)
    yield cluster
    yield from stack  # its teardown


@pytest.fixture(scope="session")
def push_stack(pytestconfig: pytest.Config, request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """A local cluster with Trainer v2.3.0's TrainJobStatus gate on: its status server
    serves and trainer pods push to it (:class:`~localdev.cluster.stack.Cluster`
    ``push=True``).  The session's :func:`kube_stack` when that runs with ``--push``,
    else a second cluster of its own."""
    if pytestconfig.getoption("push"):
        yield request.getfixturevalue("kube_stack")
        return
    yield from started_cluster(pytestconfig, Cluster(flavour=FLAVOUR_CURRENT, push=True))


@pytest.fixture(scope="session")
def kueue_stack(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    """A local cluster with Kueue v0.17.0 and its TrainJob integration in front of the
    Trainer (:class:`~localdev.cluster.stack.Cluster` ``kueue=True``); a cluster of its
    own, so Kueue's admission never holds up the other stack tests."""
    yield from started_cluster(pytestconfig, Cluster(flavour=FLAVOUR_CURRENT, kueue=True))


@pytest.fixture(scope="session")
def kueue_api(kueue_stack: Cluster) -> Iterator[client.ApiClient]:
    """An admin ApiClient for :func:`kueue_stack`."""
    yield from _admin_api(kueue_stack)


@pytest.fixture
def kueue_namespace(kueue_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on :func:`kueue_stack`, deleted after the test."""
    yield from _deleted_namespace(kueue_api, request)


@pytest.fixture(scope="session")
def stack_api(kube_stack: Cluster) -> Iterator[client.ApiClient]:
    """An admin ApiClient for the session's local cluster."""
    yield from _admin_api(kube_stack)


@pytest.fixture
def stack_namespace(stack_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the local cluster, deleted after the test (the namespace
    controller and the garbage collector remove what is in it)."""
    yield from _deleted_namespace(stack_api, request)


@pytest.fixture(scope="session")
def push_api(push_stack: Cluster) -> Iterator[client.ApiClient]:
    """An admin ApiClient for the push cluster (:func:`push_stack`)."""
    yield from _admin_api(push_stack)


@pytest.fixture
def push_namespace(push_api: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace on the push cluster, deleted after the test."""
    yield from _deleted_namespace(push_api, request)


@pytest.fixture(scope="session")
def legacy_stack(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    """A local cluster of the "before-v2.2" flavour: Trainer v2.0.0 with its CRDs (no
    trainerStatus), webhook and runtimes as shipped; TrainJobs take ``podSpecOverrides``
    (``trainjobs.trainjob_body(..., legacy=True)``)."""
    yield from started_cluster(pytestconfig, Cluster(flavour=FLAVOUR_LEGACY))


@pytest.fixture(scope="session")
def legacy_api(legacy_stack: Cluster) -> Iterator[client.ApiClient]:
    """An admin ApiClient for :func:`legacy_stack`."""
    yield from _admin_api(legacy_stack)


@pytest.fixture
def legacy_namespace(legacy_api: client.ApiClient, request: pytest.FixtureRequest
                     ) -> Iterator[str]:
    """A fresh namespace on :func:`legacy_stack`, deleted after the test."""
    yield from _deleted_namespace(legacy_api, request)
