"""A pod's file volumes and hosts file, written as the kubelet writes them.

Used by the pod runner (:mod:`localdev.cluster.podrunner`).  Volume types handled:

* ``projected`` with ``serviceAccountToken`` (a TokenRequest for the pod's
  ServiceAccount with the source's ``audience`` and ``expirationSeconds``, bound
  to the pod by name and uid, as the kubelet asks for it), ``configMap``,
  ``secret`` and ``downwardAPI`` (``fieldRef``) sources;
* ``configMap``, ``secret`` and ``downwardAPI`` volumes.

Each volume becomes a host directory; :func:`bind_mounts` pairs it with the
container's ``mountPath`` (and ``subPath``) for a private mount namespace
(:mod:`localdev.cluster.mounts`).  Not done: refreshing a token before it
expires (the kubelet renews at 80 % of its lifetime; the local runs are shorter
than the Trainer's 3600 s), ``clusterTrustBundle`` and ``podCertificate``
sources, and updates of a ConfigMap after the pod started.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes import client

#: The kubelet's default file mode of a projected/configMap/secret volume's files.
DEFAULT_MODE = 0o644
#: Expiry of a serviceAccountToken source without ``expirationSeconds`` (API default).
DEFAULT_TOKEN_SECONDS = 3600
#: Volume types this module writes.
FILE_VOLUME_TYPES = ("projected", "configMap", "secret", "downwardAPI")


class VolumeNotReady(RuntimeError):
    """A source a volume needs (ConfigMap, Secret, key) does not exist yet; the
    kubelet keeps the pod waiting and retries, and so does the caller."""


def _write(path: Path, data: bytes, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as handle:
        os.fchmod(handle.fileno(), mode)
        handle.write(data)
    tmp.replace(path)


def _items(data: Mapping[str, bytes], items: Sequence[Mapping[str, Any]] | None, what: str,
           optional: bool) -> list[tuple[str, bytes, int | None]]:
    """``(path, bytes, mode)`` of the keys of ``data`` a source selects (all without items)."""
    if not items:
        return [(key, value, None) for key, value in data.items()]
    result = []
    for item in items:
        if item["key"] not in data:
            if optional:
                continue
            raise VolumeNotReady(f"{what} has no key {item['key']!r}")
        result.append((item["path"], data[item["key"]], item.get("mode")))
    return result


class VolumeWriter:
    """Writes the file volumes of pods under a directory per pod."""

    def __init__(self, core: client.CoreV1Api, read_field: Callable[[dict[str, Any],
                                                                    dict[str, Any]], str | None]
                 ) -> None:
        """``read_field(pod, valueFrom-like source)`` resolves a downward-API ``fieldRef``."""
        self.core = core
        self.read_field = read_field

    def write(self, pod: dict[str, Any], directory: Path) -> dict[str, Path]:
        """Write each file volume of ``pod`` to ``directory/<volume name>``; return
        ``{volume name: directory}``.

        Raises:
            VolumeNotReady: a required ConfigMap, Secret or key is missing (retry later).
            kubernetes.client.ApiException: the API refused a read or a TokenRequest.
        """
        written = {}
        for volume in pod["spec"].get("volumes") or []:
            kind = next((k for k in FILE_VOLUME_TYPES if k in volume), None)
            if kind is None:
                continue
            target = directory / volume["name"]
            files = self._files(pod, kind, volume[kind])
            default_mode = int(volume[kind].get("defaultMode", DEFAULT_MODE))
            for rel, data, mode in files:
                _write(target / rel, data, default_mode if mode is None else int(mode))
            target.mkdir(parents=True, exist_ok=True)
            written[volume["name"]] = target
        return written

    def _files(self, pod: dict[str, Any], kind: str, source: dict[str, Any]
               ) -> list[tuple[str, bytes, int | None]]:
        if kind == "projected":
            files: list[tuple[str, bytes, int | None]] = []
            for projection in source.get("sources") or []:
                for sub, spec in projection.items():
                    files.extend(self._files(pod, sub, spec))
            return files
        if kind == "serviceAccountToken":
            return [(source["path"], self._token(pod, source).encode(), None)]
        namespace = pod["metadata"]["namespace"]
        optional = bool(source.get("optional"))
        if kind == "configMap":
            try:
                cm = self.core.read_namespaced_config_map(source["name"], namespace)
            except client.ApiException as exc:
                if exc.status == 404 and optional:
                    return []
                if exc.status == 404:
                    raise VolumeNotReady(f"ConfigMap {namespace}/{source['name']} not found") \
                        from None
                raise
            data = {k: v.encode() for k, v in (cm.data or {}).items()}
            data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
            return _items(data, source.get("items"), f"ConfigMap {source['name']}", optional)
        if kind == "secret":
            name = source.get("secretName") or source.get("name")
            try:
                secret = self.core.read_namespaced_secret(name, namespace)
            except client.ApiException as exc:
                if exc.status == 404 and optional:
                    return []
                if exc.status == 404:
                    raise VolumeNotReady(f"Secret {namespace}/{name} not found") from None
                raise
            data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
            return _items(data, source.get("items"), f"Secret {name}", optional)
        if kind == "downwardAPI":
            result: list[tuple[str, bytes, int | None]] = []
            for item in source.get("items") or []:
                if "fieldRef" in item:
                    value = self.read_field(pod, {"fieldRef": item["fieldRef"]}) or ""
                    result.append((item["path"], value.encode(), item.get("mode")))
            return result
        return []  # clusterTrustBundle, podCertificate: not written here

    def _token(self, pod: dict[str, Any], source: dict[str, Any]) -> str:
        """A TokenRequest as the kubelet makes it for a serviceAccountToken projection."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec = client.V1TokenRequestSpec(
            audiences=[source["audience"]] if source.get("audience") else [],
            expiration_seconds=int(source.get("expirationSeconds", DEFAULT_TOKEN_SECONDS)),
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]))
        result = self.core.create_namespaced_service_account_token(
            account, meta["namespace"], client.AuthenticationV1TokenRequest(spec=spec))
        return str(result.status.token)


def bind_mounts(container: dict[str, Any], volumes: Mapping[str, Path]) -> list[tuple[Path, str]]:
    """``(host path, mountPath)`` of the container's mounts of written ``volumes``.

    A ``subPath`` mounts that entry of the volume (file or directory).
    """
    result = []
    for mount in container.get("volumeMounts") or []:
        source = volumes.get(mount.get("name", ""))
        if source is None or not mount.get("mountPath"):
            continue
        if mount.get("subPath"):
            source = source / mount["subPath"]
        result.append((source, mount["mountPath"]))
    return result


def hosts_file(pod: dict[str, Any], aliases: Sequence[tuple[str, Sequence[str]]],
               base: str) -> str:
    """The pod's ``/etc/hosts``: ``base`` (the host's), the pod's own name on its IP
    (as the kubelet writes it), then ``aliases`` (IP, names), like ``hostAliases``."""
    lines = [base.rstrip("\n"), "# The pod's entries (the local cluster's pod runner)."]
    ip = (pod.get("status") or {}).get("podIP")
    if ip:
        lines.append(f"{ip}\t{pod['metadata']['name']}")
    for alias in pod["spec"].get("hostAliases") or []:
        lines.append(f"{alias['ip']}\t{' '.join(alias.get('hostnames') or [])}")
    for address, names in aliases:
        lines.append(f"{address}\t{' '.join(names)}")
    return "\n".join(lines) + "\n"
