"""Facts a process learns from the pod it runs in."""

from __future__ import annotations

from pathlib import Path

#: Mounted into every pod whose service account token is automounted (Kubernetes docs,
#: "Accessing the Kubernetes API from a Pod"); holds the pod's namespace.
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def service_account_namespace(path: Path | str = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The pod's namespace from the service account mount (``path``); None outside a pod
    (or empty)."""
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None
