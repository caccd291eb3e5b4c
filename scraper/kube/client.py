"""Loading the official Kubernetes client, and the one request timeout of its calls."""

from __future__ import annotations

from pathlib import Path

from kubernetes import client as k8s
from kubernetes import config as k8s_config

#: ``(connect, read)`` seconds of every API call but the watch (whose read waits for
#: events by design).  The read timeout bounds the wait between two bytes, not the whole
#: answer, so a large list page stays within it.
REQUEST_TIMEOUT = (5, 20)


def load_client(kubeconfig: Path | None) -> k8s.ApiClient:
    """An ApiClient from ``kubeconfig``, else in-cluster, else the default kubeconfig.

    Raises:
        kubernetes.config.ConfigException: no configuration found anywhere.
    """
    if kubeconfig:
        return k8s_config.new_client_from_config(config_file=str(kubeconfig))
    try:
        configuration = k8s.Configuration()
        k8s_config.load_incluster_config(client_configuration=configuration)
        return k8s.ApiClient(configuration)
    except k8s_config.ConfigException:
        return k8s_config.new_client_from_config()
