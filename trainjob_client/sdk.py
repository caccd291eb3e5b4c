"""The trainer status in notebooks, through the Kubeflow SDK (``kubeflow`` 0.5).

``TrainerClient.get_job()`` returns a ``TrainJob`` type without the trainer status, and
``wait_for_job_status(name, ..., callbacks=[...])`` calls each callback with that type
on every poll (``kubeflow/trainer/backends/kubernetes/backend.py``).  This module adds:

* :func:`get_trainer_status`: the TrainJob's trainer status as the
  ``kubeflow_trainer_api`` model ``TrainerV1alpha1TrainerStatus``, from
  ``status.trainerStatus`` or, on Trainer releases before v2.2, the annotation
  (:mod:`trainjob_client.annotation`);
* :class:`ProgressCallback`: a callback for ``wait_for_job_status`` that draws a tqdm
  bar (a widget in Jupyter) with the trainer's ETA and the chosen metrics.

Both read with the SDK client's own API client and namespace (its kubeconfig,
context and identity), so they see exactly what the SDK sees.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING, Any

from kubeflow_trainer_api.models import TrainerV1alpha1TrainerStatus
from kubernetes import client

from trainjob_client.bar import TrainJobBar
from trainjob_client.kube import TrainJobReadError, TrainJobs
from trainjob_client.progress import TrainJobProgress, trainjob_progress

if TYPE_CHECKING:
    from kubeflow.trainer import TrainerClient
    from kubeflow.trainer.types.types import TrainJob

log = logging.getLogger(__name__)

#: ``TrainJob.status`` values (SDK constants) after which the bar is closed.
SDK_END_STATES = ("Complete", "Failed")


def _sdk_access(trainer_client: TrainerClient | None, namespace: str | None,
                api_client: client.ApiClient | None) -> tuple[client.ApiClient, str]:
    if api_client is not None:
        if namespace is None:
            raise ValueError("namespace: required with api_client")
        return api_client, namespace
    if trainer_client is None:
        from kubeflow.trainer import TrainerClient

        trainer_client = TrainerClient()
    from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend

    backend = trainer_client.backend
    if not isinstance(backend, KubernetesBackend):
        raise TypeError(f"trainer_client: needs the Kubernetes backend, got "
                        f"{type(backend).__name__} (local backends have no TrainJob objects)")
    return backend.custom_api.api_client, namespace or str(backend.namespace)


def read_progress(name: str, trainer_client: TrainerClient | None = None, *,
                  namespace: str | None = None,
                  api_client: client.ApiClient | None = None) -> TrainJobProgress:
    """State and trainer status of TrainJob ``name`` (see :class:`TrainJobProgress`).

    With ``trainer_client`` (a ``kubeflow.trainer.TrainerClient`` on the Kubernetes
    backend) it reads with that client's API client, in its namespace unless
    ``namespace`` is given; with ``api_client`` and ``namespace`` it reads with those;
    with neither it makes a ``TrainerClient()`` (the SDK's default kubeconfig).

    Raises:
        TrainJobNotFound, TrainJobForbidden, TrainJobApiMissing, TrainJobReadError:
            the read failed; the message names the TrainJob and namespace.
        TypeError: ``trainer_client`` uses a local backend.
    """
    api, ns = _sdk_access(trainer_client, namespace, api_client)
    return trainjob_progress(TrainJobs(api).get(ns, name))


def get_trainer_status(name: str, trainer_client: TrainerClient | None = None, *,
                       namespace: str | None = None,
                       api_client: client.ApiClient | None = None,
                       ) -> TrainerV1alpha1TrainerStatus | None:
    """TrainJob ``name``'s trainer status as ``kubeflow_trainer_api``'s model, or ``None``.

    ``None`` means no status was reported yet (neither ``status.trainerStatus`` nor
    the annotation holds one).  Arguments and errors as :func:`read_progress`.
    Values are those of the Trainer v1alpha1 API: ``progress_percentage`` 0..100,
    ``estimated_remaining_seconds`` in seconds, ``metrics`` a list of
    ``TrainerV1alpha1Metric`` with string ``name`` and ``value``, ``last_updated_time``
    a UTC ``datetime`` with whole seconds.
    """
    status = read_progress(name, trainer_client, namespace=namespace,
                           api_client=api_client).status
    if status is None:
        return None
    return TrainerV1alpha1TrainerStatus.from_dict(status.to_api())


class ProgressCallback:
    """A ``wait_for_job_status`` callback that draws the TrainJob's progress with tqdm.

    ``client.wait_for_job_status(name, callbacks=[ProgressCallback(client, metrics=["loss"])])``

    On every poll the SDK hands over its ``TrainJob`` (name and SDK status only); the
    callback reads the trainer status of that TrainJob (see :func:`read_progress` for
    ``trainer_client``, ``namespace``, ``api_client``) and moves one bar per TrainJob
    name; it closes the bar when the SDK status is ``Complete`` or ``Failed``.  ``file``,
    ``leave`` and further keywords go to tqdm.

    A read that fails (no permission, API unreachable) does not stop the wait: the bar
    shows the error and it is logged once per distinct message.
    """

    def __init__(self, trainer_client: TrainerClient | None = None, *,
                 metrics: Sequence[str] = (), namespace: str | None = None,
                 api_client: client.ApiClient | None = None, file: IO[str] | None = None,
                 leave: bool = True, **tqdm_options: Any) -> None:
        api, self.namespace = _sdk_access(trainer_client, namespace, api_client)
        self._trainjobs = TrainJobs(api)
        self.metrics = tuple(metrics)
        self._bar_options: dict[str, Any] = {"file": file, "leave": leave, **tqdm_options}
        self.bars: dict[str, TrainJobBar] = {}
        self._logged: set[str] = set()

    def __call__(self, trainjob: TrainJob) -> None:
        """Read and draw TrainJob ``trainjob.name``'s progress (the SDK calls this)."""
        bar = self.bars.get(trainjob.name)
        if bar is None:
            bar = self.bars[trainjob.name] = TrainJobBar(trainjob.name, self.metrics,
                                                         **self._bar_options)
        try:
            item = trainjob_progress(self._trainjobs.get(self.namespace, trainjob.name))
        except TrainJobReadError as exc:
            if str(exc) not in self._logged:
                self._logged.add(str(exc))
                log.warning("trainer status of TrainJob %s/%s unavailable: %s",
                            self.namespace, trainjob.name, exc)
            item = TrainJobProgress(self.namespace, trainjob.name, trainjob.status, None,
                                    None, None, problem=f"unavailable: {exc}")
        if not item.state:
            # The SDK's own state (Created/Running) when the TrainJob has no condition yet.
            item = dataclasses.replace(item, state=trainjob.status)
        bar.show(item)
        if trainjob.status in SDK_END_STATES or item.ended:
            bar.close()

    def close(self) -> None:
        """Close every bar (after an interrupted or timed-out wait)."""
        for bar in self.bars.values():
            bar.close()


__all__ = ["ProgressCallback", "get_trainer_status", "read_progress"]
