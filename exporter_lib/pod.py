"""Facts a process learns from the pod it runs in."""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


# -- which pod answers ----------------------------------------------------------------

#: Response header naming the pod that answers, on every exporter answer: an RFC 8941
#: dictionary of strings, each member present only when known, e.g.
#: ``hostname="tj-node-0-0", name="tj-node-0-0-x7k2q", namespace="team", uid="5f0e..."``.
POD_HEADER = "Trainjob-Exporter-Pod"
#: The container runtime sets it to the pod's hostname in every container (containerd's
#: and CRI-O's CRI plugins; the kubelet's rule for the value is :func:`kubelet_hostname`).
ENV_HOSTNAME = "HOSTNAME"
#: Downward API variables a pod spec may set (``fieldRef`` ``metadata.name``,
#: ``metadata.uid``, ``metadata.namespace``); read when present, never required.
ENV_POD_NAME = "POD_NAME"
ENV_POD_UID = "POD_UID"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
#: Set by the kubelet in every container (the API service's address); the exporter reads
#: ``gethostname()`` only when it is set, since outside a pod that names the machine.
ENV_IN_CLUSTER = "KUBERNETES_SERVICE_HOST"
#: Longest hostname the kubelet gives a pod (a DNS label).
HOSTNAME_MAX = 63

_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
_MEMBER = re.compile(r'\s*([a-z]+)="([^"\\]*)"\s*')
#: Any RFC 8941 dictionary member's key (what follows it is not read for unknown keys).
_KEY = re.compile(r'\s*([a-z*][a-z0-9_.*-]*)')
_FIELDS = ("hostname", "name", "namespace", "uid")


@dataclass(frozen=True)
class PodIdentity:
    """What a pod states about itself; each part ``None`` when not known.

    ``hostname`` is the container's hostname (by default the pod name, see
    :func:`kubelet_hostname`); ``name``, ``namespace``, ``uid`` come from the downward API.
    """

    hostname: str | None = None
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None

    def header(self) -> str | None:
        """The :data:`POD_HEADER` value, or ``None`` when nothing is known."""
        parts = [f'{key}="{value}"' for key in _FIELDS
                 if (value := getattr(self, key)) is not None]
        return ", ".join(parts) or None

    @classmethod
    def parse(cls, text: str | None) -> PodIdentity | None:
        """The identity a :data:`POD_HEADER` value states; ``None`` when the header is
        absent, malformed, or states nothing (unknown keys are ignored, so a newer
        exporter may add some)."""
        if not text:
            return None
        found: dict[str, str] = {}
        for member in text.split(","):
            key = _KEY.match(member)
            if key is None:
                return None
            if key.group(1) not in _FIELDS:
                continue  # a later version's member, of whatever type: ignored
            # A known member must be a plain string of name characters (parameters
            # after ';' are ignored); otherwise nothing stated can be trusted.
            match = _MEMBER.fullmatch(member.split(";", 1)[0])
            if match is None or not _VALUE.fullmatch(match.group(2)):
                return None
            found.setdefault(match.group(1), match.group(2))
        return cls(**found) if found else None


def kubelet_hostname(pod_name: str, spec_hostname: str | None = None) -> str:
    """The hostname the kubelet gives a pod's containers: ``spec.hostname`` if set, else
    the pod name, cut to :data:`HOSTNAME_MAX` characters with trailing ``-``/``.``
    removed (kubelet ``GeneratePodHostNameAndDomain`` / ``truncatePodHostnameIfNeeded``).
    With ``setHostnameAsFQDN`` the container sees ``<this>.<subdomain>...``; compare
    the first label (:func:`hostname_label`)."""
    name = spec_hostname or pod_name
    return name[:HOSTNAME_MAX].rstrip("-.") if len(name) > HOSTNAME_MAX else name


def hostname_label(hostname: str) -> str:
    """The first DNS label of a hostname (``a.b.svc`` -> ``a``)."""
    return hostname.split(".", 1)[0]


def pod_identity(environ: Mapping[str, str] | None = None,
                 gethostname: Callable[[], str] = socket.gethostname,
                 namespace_file: Callable[[], str | None] = service_account_namespace,
                 ) -> PodIdentity:
    """This process's :class:`PodIdentity` from its environment (module constants);
    values that are not DNS-name or UID characters are left out."""
    env = os.environ if environ is None else environ

    def valid(value: str | None) -> str | None:
        value = (value or "").strip()
        return value if _VALUE.fullmatch(value) else None

    hostname = valid(env.get(ENV_HOSTNAME))
    if hostname is None and env.get(ENV_IN_CLUSTER):
        with contextlib.suppress(OSError):
            hostname = valid(gethostname())
    # The namespace: the downward API's when set, else the ServiceAccount mount's (every
    # pod that mounts its token has it), so two pods of one name in two namespaces (JobSet
    # hostnames carry no namespace) are told apart.
    namespace = valid(env.get(ENV_POD_NAMESPACE)) or valid(namespace_file())
    return PodIdentity(hostname, valid(env.get(ENV_POD_NAME)), namespace,
                       valid(env.get(ENV_POD_UID)))
