"""Loading the official Kubernetes client, and the one request timeout of its calls.

The client is built **without urllib3's retries**: the official client leaves
urllib3's default of 3 retries, so one call with a 20 s read timeout could block
80 s, longer than any decision waiting on it (the Lease renew deadline, the write
retry budget).  Retries are the call path's (:mod:`scraper.kube.calls`), visible
and within the caller's deadline.
"""

from __future__ import annotations

from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client import rest as k8s_rest

#: ``(connect, read)`` seconds of every API call but the watch (whose read waits for
#: events by design).  The read timeout bounds the wait between two bytes, not the whole
#: answer, so a large list page stays within it.
REQUEST_TIMEOUT = (5, 20)


def request_timeout(seconds: float) -> tuple[float, float]:
    """The ``_request_timeout`` that bounds a call's connect and its read by ``seconds``
    each, as a ``(connect, read)`` pair.

    Never pass a bare float: the official client's ``rest.py`` (kubernetes 35.0.0)
    honours an ``int`` or a pair and silently drops anything else, so a call given
    ``_request_timeout=5.0`` has no timeout at all (a hung API server held such a call
    forever).  ``tests/scraper/test_kube_timeouts.py`` checks both halves of this.
    """
    return (seconds, seconds)


def load_client(kubeconfig: Path | None) -> k8s.ApiClient:
    """An ApiClient from ``kubeconfig``, else in-cluster, else the default kubeconfig,
    without urllib3 retries (:func:`without_retries`).

    Raises:
        kubernetes.config.ConfigException: no configuration found anywhere.
    """
    if kubeconfig:
        return without_retries(k8s_config.new_client_from_config(config_file=str(kubeconfig)))
    try:
        configuration = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=configuration)
        return without_retries(k8s.ApiClient(configuration))
    except k8s_config.ConfigException:
        return without_retries(k8s_config.new_client_from_config())


def without_retries(api_client: k8s.ApiClient) -> k8s.ApiClient:
    """``api_client`` with urllib3's retries turned off (its connection pool rebuilt).

    A connect error, a read timeout or a dropped connection then raises at once
    (a ``urllib3.exceptions.HTTPError``) instead of being retried inside the call.
    Returns the same object, changed.
    """
    configuration = api_client.configuration
    if configuration.retries is not False:
        configuration.retries = False
        api_client.rest_client.pool_manager.clear()
        api_client.rest_client = k8s_rest.RESTClientObject(configuration)
    return api_client
