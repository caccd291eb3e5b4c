"""Which TrainJob this pod belongs to, as far as the pod itself is told.

The push endpoint checks that a push names this pod's TrainJob (why: ``docs/decisions.md``,
"A push must name the pod's own TrainJob").
Kubernetes tells a container nothing about its owners by itself; what reaches the
environment, in the order used here:

* the TrainJob's name:

  1. ``TRAINJOB_NAME``, set by the user, best through the downward API from the
     label JobSet puts on every pod of a TrainJob (the JobSet is named after the
     TrainJob)::

         env:
         - name: TRAINJOB_NAME
           valueFrom:
             fieldRef:
               fieldPath: metadata.labels['jobset.sigs.k8s.io/jobset-name']

  2. ``KUBEFLOW_TRAINER_SERVER_URL`` as Trainer v2.2+ injects it for its push status
     server (feature gate ``TrainJobStatus``): its path names namespace and TrainJob;
  3. ``PET_MASTER_ADDR``, which Trainer's torch plugin sets to
     ``<trainjob>-node-0-0.<trainjob>`` (source: kubeflow/trainer v2.0.0
     ``pkg/runtime/framework/plugins/torch/torch.go``); read only when it has exactly
     that shape, so the name is stated twice.

* the namespace: the path of 2., else the service account's namespace file, else
  ``POD_NAMESPACE`` (downward API ``metadata.namespace``).

Nothing else is guessed: where no source says it, the name stays unknown and the
endpoint cannot check it (documented in ``docs/exporter.md``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from exporter_lib.pod import SERVICE_ACCOUNT_NAMESPACE, service_account_namespace
from exporter_lib.status import API_GROUP, API_VERSION, TRAINJOB_PLURAL

ENV_TRAINJOB_NAME = "TRAINJOB_NAME"
ENV_POD_NAMESPACE = "POD_NAMESPACE"
ENV_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_PET_MASTER_ADDR = "PET_MASTER_ADDR"

#: A Kubernetes object name as the push path may carry it (DNS-1123 subdomain characters).
_NAME = r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?"
NAME_RE = re.compile(_NAME)
STATUS_PATH = re.compile(
    rf"^/apis/{re.escape(API_GROUP)}/{API_VERSION}/namespaces/({_NAME})/"
    rf"{TRAINJOB_PLURAL}/({_NAME})/status/?$")


@dataclass(frozen=True)
class TrainJobRef:
    """This pod's TrainJob: ``namespace`` and ``name``, each ``None`` when not known.

    ``source`` says where the name came from (an environment variable), for messages.
    """

    namespace: str | None
    name: str | None
    source: str | None = None

    def allows(self, namespace: str, name: str) -> bool:
        """True unless a known part differs from ``namespace``/``name``."""
        return (self.namespace is None or self.namespace == namespace) and (
            self.name is None or self.name == name)

    def describe(self) -> str:
        """``ns/name`` with ``?`` for unknown parts."""
        return f"{self.namespace or '?'}/{self.name or '?'}"


def status_path(namespace: str, name: str) -> str:
    """The push design's status URL path for one TrainJob."""
    return f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{namespace}/{TRAINJOB_PLURAL}/{name}/status"


def parse_status_path(path: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a push status path, or ``None`` when it is not one."""
    match = STATUS_PATH.match(path)
    return None if match is None else (match.group(1), match.group(3))


def pod_trainjob(environ: Mapping[str, str] | None = None,
                 namespace_file: str | Path = SERVICE_ACCOUNT_NAMESPACE) -> TrainJobRef:
    """This pod's TrainJob from the sources listed in the module docstring."""
    env = os.environ if environ is None else environ
    upstream = _from_server_url(env.get(ENV_SERVER_URL))
    name, source = None, None
    given = (env.get(ENV_TRAINJOB_NAME) or "").strip()
    if given and NAME_RE.fullmatch(given):
        name, source = given, ENV_TRAINJOB_NAME
    elif upstream is not None:
        name, source = upstream[1], ENV_SERVER_URL
    else:
        name = _from_master_addr(env.get(ENV_PET_MASTER_ADDR))
        source = ENV_PET_MASTER_ADDR if name else None
    namespace = upstream[0] if upstream is not None else pod_namespace(env, namespace_file)
    return TrainJobRef(namespace, name, source)


def pod_namespace(environ: Mapping[str, str] | None = None,
                  namespace_file: str | Path = SERVICE_ACCOUNT_NAMESPACE) -> str | None:
    """The pod's namespace: the service account's namespace file, else ``$POD_NAMESPACE``."""
    env = os.environ if environ is None else environ
    text = service_account_namespace(namespace_file) or (env.get(ENV_POD_NAMESPACE) or "").strip()
    return text if NAME_RE.fullmatch(text) else None


def _from_server_url(url: str | None) -> tuple[str, str] | None:
    if not url:
        return None
    try:
        path = urlsplit(url).path
    except ValueError:
        return None
    return parse_status_path(path)


def _from_master_addr(addr: str | None) -> str | None:
    head, _, tail = (addr or "").partition(".")
    if tail and NAME_RE.fullmatch(tail) and head == f"{tail}-node-0-0":
        return tail
    return None
