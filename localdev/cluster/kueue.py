"""Kueue on the local cluster (``Cluster(kueue=True)``): configuration and queues.

Kueue (``sigs.k8s.io/kueue``, built by ``scripts/stack-assets``) runs like the
JobSet controller: its shipped CRDs (``config/components/crd/bases``) and
admission webhooks (``config/components/webhook``, pointed at 127.0.0.1 with a
``caBundle``), internal cert management off and a dev CA's serving certificate in
its ``certDir``.  Only the TrainJob integration (``trainer.kubeflow.org/trainjob``)
is enabled, with ``batch/job`` (:data:`FRAMEWORKS`); Kueue answers the webhooks of
the other frameworks with its no-op handlers.

:func:`queue_objects` gives the objects a test queues TrainJobs with: a
ResourceFlavor, a ClusterQueue whose small CPU quota forces preemption by
priority within it, a LocalQueue and two WorkloadPriorityClasses.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: Kueue's API group and the version the stack uses (the CRDs' storage version).
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
#: Namespace Kueue runs in (its default, ``config.Namespace``).
KUEUE_NAMESPACE = "kueue-system"
KUEUE_BINARY = "kueue-controller-manager"
#: The metrics certificate directory compiled into Kueue (``cmd/kueue/main.go``), read
#: when its internal cert management is off.
KUEUE_METRICS_CERT_DIR = "/etc/kueue/metrics/certs"
#: The TrainJob integration's framework name in Kueue's Configuration.
TRAINJOB_FRAMEWORK = "trainer.kubeflow.org/trainjob"
#: Kueue's integrations enabled here.  ``batch/job`` as well: Kueue v0.17.0's Job
#: webhook ignores the no-op option a disabled integration gets and then panics on
#: every Job create (nil queue manager); enabled, it leaves Jobs without a queue
#: name (the JobSet's Jobs of a TrainJob) alone.
FRAMEWORKS = ("batch/job", TRAINJOB_FRAMEWORK)
#: Kueue feature gates set on the local cluster's command line: the visibility API server
#: off (it would need an APIService and a fixed port); ``PriorityBoost`` (Alpha in
#: v0.17.0, off by default) on, so the scraper's checkpoint-aware preemption can be tried
#: here.  Without a ``kueue.x-k8s.io/priority-boost`` annotation a Workload's priority is
#: its own, gate or not (``pkg/util/priority/priority.go``: a missing annotation is 0).
KUEUE_FEATURE_GATES = "VisibilityOnDemand=false,PriorityBoost=true"
#: Label that puts a TrainJob into a LocalQueue, and the one naming its priority class.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
#: Names of the queue objects :func:`queue_objects` makes.
RESOURCE_FLAVOR = "default-flavor"
CLUSTER_QUEUE = "trainjobs"
LOCAL_QUEUE = "trainjobs"
LOW_PRIORITY = "low-priority"
HIGH_PRIORITY = "high-priority"
#: The ClusterQueue's CPU quota: one TrainJob asking for all of it leaves no room
#: for a second one, so the second one preempts (higher priority) or waits.
CPU_QUOTA = "1"


def kueue_configuration(*, webhook_port: int, probe_port: int, cert_dir: Path) -> dict[str, Any]:
    """Kueue's ``config.kueue.x-k8s.io/v1beta2`` Configuration for the local cluster.

    No leader election, no metrics server, webhook and probes on 127.0.0.1, the
    serving certificate read from ``cert_dir`` (``tls.crt``, ``tls.key``), and the
    integrations :data:`FRAMEWORKS`; jobs without a queue name are left alone.
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "manageJobsWithoutQueueName": False,
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }


def queue_objects(namespace: str, *, cpu_quota: str = CPU_QUOTA) -> list[dict[str, Any]]:
    """ResourceFlavor, ClusterQueue, LocalQueue (in ``namespace``), two priority classes.

    The ClusterQueue covers ``cpu`` (``cpu_quota``), ``memory`` and
    ``nvidia.com/gpu`` and preempts within itself by priority
    (``withinClusterQueue: LowerPriority``).  :data:`LOW_PRIORITY` has value 100,
    :data:`HIGH_PRIORITY` 1000.
    """
    api_version = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
    return [
        {"apiVersion": api_version, "kind": "ResourceFlavor",
         "metadata": {"name": RESOURCE_FLAVOR}},
        {"apiVersion": api_version, "kind": "ClusterQueue",
         "metadata": {"name": CLUSTER_QUEUE},
         "spec": {
             "namespaceSelector": {},
             "preemption": {"withinClusterQueue": "LowerPriority"},
             "resourceGroups": [{
                 "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                 "flavors": [{"name": RESOURCE_FLAVOR, "resources": [
                     {"name": "cpu", "nominalQuota": cpu_quota},
                     {"name": "memory", "nominalQuota": "64Gi"},
                     {"name": "nvidia.com/gpu", "nominalQuota": "64"}]}],
             }],
         }},
        {"apiVersion": api_version, "kind": "LocalQueue",
         "metadata": {"name": LOCAL_QUEUE, "namespace": namespace},
         "spec": {"clusterQueue": CLUSTER_QUEUE}},
        {"apiVersion": api_version, "kind": "WorkloadPriorityClass",
         "metadata": {"name": LOW_PRIORITY}, "value": 100,
         "description": "preemptible training"},
        {"apiVersion": api_version, "kind": "WorkloadPriorityClass",
         "metadata": {"name": HIGH_PRIORITY}, "value": 1000,
         "description": "preempts low-priority trainings"},
    ]


#: Plural resource names of the kinds :func:`queue_objects` makes.
PLURALS = {"ResourceFlavor": "resourceflavors", "ClusterQueue": "clusterqueues",
           "LocalQueue": "localqueues", "WorkloadPriorityClass": "workloadpriorityclasses",
           "Workload": "workloads"}
