"""Reading TrainJobs from the Kubernetes API, with errors that name what and where.

The connection is found the way kubectl finds it: ``--kubeconfig``, else the files in
``KUBECONFIG`` (merged, ``:``-separated), else ``~/.kube/config``, else the in-cluster
ServiceAccount; ``--context`` picks a context; the namespace defaults to the context's
namespace, else ``default`` (kubectl's rules, ``k8s.io/client-go/tools/clientcmd``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client, config, watch

from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL

RESOURCE = f"{TRAINJOB_PLURAL}.{API_GROUP}"
#: In-cluster namespace file of the pod's ServiceAccount (Kubernetes documents this path).
SERVICE_ACCOUNT_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
#: Seconds one watch request stays open before it is renewed (the server may end it sooner).
WATCH_REQUEST_SECONDS = 300
#: Seconds a watch's read may wait past the server's own ``timeoutSeconds`` before the
#: connection counts as dead (the server ends a quiet watch itself).
WATCH_READ_SLACK_SECONDS = 30
#: ``(connect, read)`` seconds of each get and list, the scraper's own figures
#: (``scraper/kube/client.py``; this package does not import the scraper).  Always a
#: pair: the official client drops a bare float timeout.
REQUEST_TIMEOUT = (5, 20)
#: A watch request that ends sooner than this with no event counts as cut short (a
#: proxy that closes long requests, a server that is not an API server): the next one
#: waits, from the first pause up to the last, doubling, so the plugin never loops hot.
WATCH_SHORT_SECONDS = 1.0
WATCH_PAUSE_FIRST_SECONDS = 0.5
WATCH_PAUSE_MAX_SECONDS = 5.0


class TrainJobReadError(RuntimeError):
    """Reading TrainJobs failed; ``str()`` names the object, the namespace and the cause."""


class KubeconfigError(TrainJobReadError):
    """No usable kubeconfig or in-cluster identity, or the chosen context does not exist."""


class TrainJobNotFound(TrainJobReadError):
    """The TrainJob does not exist in that namespace."""

    def __init__(self, namespace: str, name: str) -> None:
        self.namespace, self.name = namespace, name
        super().__init__(f'TrainJob "{name}" not found in namespace "{namespace}"')


class TrainJobApiMissing(TrainJobReadError):
    """The API server does not serve ``trainjobs.trainer.kubeflow.org/v1alpha1``."""


class TrainJobForbidden(TrainJobReadError):
    """RBAC denied the request (HTTP 403); the message quotes the API server's reason."""


class NoTrainerStatus(TrainJobReadError):
    """The TrainJob exists but carries no trainer status yet."""


@dataclass(frozen=True)
class Connection:
    """An API client and the namespace commands use when none is given."""

    api_client: client.ApiClient
    namespace: str


def connect(kubeconfig: str | None = None, context: str | None = None) -> Connection:
    """Connect like kubectl does (see the module docstring).

    Raises:
        KubeconfigError: the named file is missing or invalid (not YAML, not UTF-8, not
            a kubeconfig's shape, a directory), the context does not exist, or there is
            neither a kubeconfig nor a usable in-cluster ServiceAccount.
    """
    try:
        return _connect(kubeconfig, context)
    except KubeconfigError:
        raise
    except config.ConfigException as exc:
        raise KubeconfigError(f"kubeconfig {_files(kubeconfig)}: {exc}") from None
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {_files(kubeconfig)} is not valid YAML: "
                              f"{' '.join(str(exc).split())}") from None
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        # ValueError: not UTF-8; TypeError, AttributeError, KeyError: YAML that is not a
        # kubeconfig's mapping (a list, a scalar); OSError: a directory, unreadable.
        raise KubeconfigError(f"kubeconfig {_files(kubeconfig)} cannot be used: "
                              f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None


def _files(kubeconfig: str | None) -> str:
    return kubeconfig or os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


def _connect(kubeconfig: str | None, context: str | None) -> Connection:
    files = _files(kubeconfig)
    existing = [p for p in files.split(os.pathsep) if p and Path(p).expanduser().exists()]
    if not existing:
        if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            configuration.retries = False  # see below
            namespace = SERVICE_ACCOUNT_NAMESPACE_FILE.read_text().strip() or "default"
            return Connection(client.ApiClient(configuration), namespace)
        raise KubeconfigError(f"no kubeconfig found (looked at {files}) and not in a cluster")
    config_file = os.pathsep.join(existing)
    contexts, active = config.list_kube_config_contexts(config_file)
    chosen = active
    if context is not None:
        chosen = next((c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(str(c.get("name")) for c in contexts)
            raise KubeconfigError(
                f'context "{context}" not found in {config_file} (contexts: {names})')
    configuration = client.Configuration()
    config.load_kube_config(config_file=config_file, context=context,
                            client_configuration=configuration)
    # No hidden urllib3 retries: an API server that does not answer is reported after
    # one request timeout, not four.
    configuration.retries = False
    api_client = client.ApiClient(configuration)
    namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    return Connection(api_client, namespace)


def _api_message(exc: client.ApiException) -> str:
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return (str(exc.body or exc.reason or "")).strip()
    return str(body.get("message", "")) if isinstance(body, dict) else str(body)


def _is_status_not_found(exc: client.ApiException) -> bool:
    # A missing object answers a Status naming the resource; a resource type the server
    # does not serve answers a bare "404 page not found".
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        return False
    return isinstance(body, dict) and body.get("kind") == "Status" and \
        (body.get("details") or {}).get("kind") == TRAINJOB_PLURAL


def _subject(namespace: str | None, name: str | None) -> tuple[str, str]:
    """What a request was about and where, as every error names them."""
    where = f'in namespace "{namespace}"' if namespace else "in all namespaces"
    return (f'{RESOURCE} "{name}"' if name else RESOURCE), where


def translate(exc: client.ApiException, verb: str, namespace: str | None,
              name: str | None) -> TrainJobReadError:
    """The :class:`TrainJobReadError` for an API error of ``verb`` on a TrainJob (or list)."""
    what, where = _subject(namespace, name)
    if not exc.status:  # no HTTP answer: the client's own failure (TLS verification)
        return TrainJobReadError(f"cannot {verb} {what} {where}: "
                                 f"{' '.join(str(exc.reason or exc).split())[:300]}")
    if exc.status == 404 and name is not None and namespace and _is_status_not_found(exc):
        return TrainJobNotFound(namespace, name)
    if exc.status == 404:
        return TrainJobApiMissing(
            f"the server does not serve {API_GROUP}/{API_VERSION} {TRAINJOB_PLURAL} "
            f"(is Kubeflow Trainer installed?): {_api_message(exc) or 'not found'}")
    if exc.status == 403:
        return TrainJobForbidden(
            f"no permission to {verb} {what} {where}: {_api_message(exc)}")
    if exc.status == 401:
        return TrainJobForbidden(
            f"not authenticated to {verb} {what} {where} (HTTP 401): check the kubeconfig's "
            f"credentials: {_api_message(exc)}")
    return TrainJobReadError(
        f"{verb} {what} {where} failed: HTTP {exc.status} {_api_message(exc) or exc.reason}")


def unreachable(exc: urllib3.exceptions.HTTPError, host: str, verb: str,
                namespace: str | None, name: str | None) -> TrainJobReadError:
    """The :class:`TrainJobReadError` for a request that got no HTTP answer (refused,
    timed out, cut), naming the API server."""
    what, where = _subject(namespace, name)
    reason = getattr(exc, "reason", None) or exc
    return TrainJobReadError(f"cannot {verb} {what} {where}: the API server {host} did not "
                             f"answer ({' '.join(str(reason).split())[:300]})")


class TrainJobs:
    """get, list and watch TrainJobs through one API client.

    Every method raises :class:`TrainJobReadError` subclasses, never ``ApiException``
    or a urllib3 error.  Each request has a timeout (``REQUEST_TIMEOUT``, connect and
    read seconds).
    """

    def __init__(self, api_client: client.ApiClient) -> None:
        self._custom = client.CustomObjectsApi(api_client)
        self._host = str(api_client.configuration.host)

    def get(self, namespace: str, name: str,
            timeout: tuple[float, float] = REQUEST_TIMEOUT) -> dict[str, Any]:
        """The TrainJob ``namespace/name`` as a ``dict``; ``timeout``: (connect, read)
        seconds of the request.

        Raises:
            TrainJobNotFound, TrainJobForbidden, TrainJobApiMissing, TrainJobReadError.
        """
        try:
            result = self._custom.get_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL, name,
                _request_timeout=timeout)
        except client.ApiException as exc:
            raise translate(exc, "get", namespace, name) from None
        except urllib3.exceptions.HTTPError as exc:
            raise unreachable(exc, self._host, "get", namespace, name) from None
        return self._object(result, "get", namespace, name)

    def _object(self, answer: Any, verb: str, namespace: str | None,
                name: str | None) -> dict[str, Any]:
        """``answer`` when it is a JSON object, as every Kubernetes answer is."""
        if not isinstance(answer, dict):
            what, _ = _subject(namespace, name)
            raise TrainJobReadError(f"cannot {verb} {what}: the server {self._host} answered "
                                    f"{type(answer).__name__}, not a Kubernetes object "
                                    "(is it an API server?)")
        return answer

    def list(self, namespace: str | None) -> list[dict[str, Any]]:
        """TrainJobs of ``namespace`` (all namespaces for ``None``), sorted by namespace, name.

        Raises:
            TrainJobForbidden, TrainJobApiMissing, TrainJobReadError.
        """
        try:
            if namespace is None:
                result = self._custom.list_cluster_custom_object(
                    API_GROUP, API_VERSION, TRAINJOB_PLURAL, _request_timeout=REQUEST_TIMEOUT)
            else:
                result = self._custom.list_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, TRAINJOB_PLURAL,
                    _request_timeout=REQUEST_TIMEOUT)
        except client.ApiException as exc:
            raise translate(exc, "list", namespace, None) from None
        except urllib3.exceptions.HTTPError as exc:
            raise unreachable(exc, self._host, "list", namespace, None) from None
        items: list[dict[str, Any]] = self._object(result, "list", namespace, None).get(
            "items", [])
        return sorted(items, key=lambda t: (t["metadata"].get("namespace", ""),
                                            t["metadata"]["name"]))

    def watch(self, namespace: str, name: str,
              timeout: float | None = None) -> Iterator[dict[str, Any]]:
        """Yield TrainJob ``namespace/name`` now and again after every change.

        A watch (not polling) on the one object: the API server sends each change as it
        is stored.  Renewed when the server ends it; relisted on 410 Gone.  Stops after
        ``timeout`` seconds (``None``: when the caller stops iterating).

        Raises:
            TrainJobNotFound: the TrainJob is missing or gets deleted.
            TrainJobForbidden, TrainJobApiMissing, TrainJobReadError.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def within(connect: float, read: float) -> tuple[float, float]:
            # A request never outlives the caller's timeout (a hung server included).
            if deadline is None:
                return (connect, read)
            left = max(0.1, deadline - time.monotonic())
            return (min(connect, left), min(read, left))

        current = self.get(namespace, name, timeout=within(*REQUEST_TIMEOUT))
        yield current
        version = current["metadata"]["resourceVersion"]
        pause = WATCH_PAUSE_FIRST_SECONDS
        while deadline is None or time.monotonic() < deadline:
            left = WATCH_REQUEST_SECONDS if deadline is None else \
                max(1, min(WATCH_REQUEST_SECONDS, int(deadline - time.monotonic()) + 1))
            watcher = watch.Watch()
            started, events = time.monotonic(), 0
            try:
                for event in watcher.stream(
                        self._custom.list_namespaced_custom_object, API_GROUP, API_VERSION,
                        namespace, TRAINJOB_PLURAL, field_selector=f"metadata.name={name}",
                        resource_version=version, timeout_seconds=left,
                        allow_watch_bookmarks=True,
                        _request_timeout=within(REQUEST_TIMEOUT[0],
                                                left + WATCH_READ_SLACK_SECONDS)):
                    events += 1
                    obj = event.get("object") if isinstance(event, dict) else None
                    if not isinstance(obj, dict):
                        raise TrainJobReadError(
                            f'cannot watch {RESOURCE} "{name}" in namespace "{namespace}": '
                            f"the server {self._host} sent an event that is not a "
                            "Kubernetes object (is it an API server?)")
                    if event.get("type") == "ERROR":  # a Status, e.g. the watch expired
                        raise TrainJobReadError(
                            f'watch of {RESOURCE} "{name}" in namespace "{namespace}" '
                            f"failed: {obj.get('message') or obj}")
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event["type"] == "DELETED":
                        raise TrainJobNotFound(namespace, name)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        yield obj
                    if deadline is not None and time.monotonic() >= deadline:
                        return
            except client.ApiException as exc:
                if exc.status != 410:
                    raise translate(exc, "watch", namespace, name) from None
                # Our resourceVersion is too old to resume from: read the object again.
                current = self.get(namespace, name, timeout=within(*REQUEST_TIMEOUT))
                version = current["metadata"]["resourceVersion"]
                yield current
            except urllib3.exceptions.HTTPError as exc:
                if deadline is not None and time.monotonic() >= deadline - 1:
                    return  # the caller's timeout cut a quiet watch, not a dead server
                raise unreachable(exc, self._host, "watch", namespace, name) from None
            finally:
                # Also when the caller stops iterating: close the open HTTP response.
                watcher.stop()
            if events or time.monotonic() - started >= WATCH_SHORT_SECONDS:
                pause = WATCH_PAUSE_FIRST_SECONDS
                continue
            wait = pause if deadline is None else min(pause, deadline - time.monotonic())
            if wait > 0:
                time.sleep(wait)
            pause = min(2 * pause, WATCH_PAUSE_MAX_SECONDS)


__all__ = [
    "Connection",
    "KubeconfigError",
    "NoTrainerStatus",
    "TrainJobApiMissing",
    "TrainJobForbidden",
    "TrainJobNotFound",
    "TrainJobReadError",
    "TrainJobs",
    "connect",
    "translate",
    "unreachable",
]
