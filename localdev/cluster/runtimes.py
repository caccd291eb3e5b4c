"""ClusterTrainingRuntimes derived from the shipped ones, as a platform team derives them.

The only change is metadata: a new name and annotations on the pod template, e.g.
``trainjob-progress.dev/source: logs`` so the scraper reads progress from the
trainer container's log (docs/log-source.md).  Applied with ``kubectl kustomize``
on a cluster, the same change is a ``nameSuffix`` plus a patch of
``/spec/template/spec/replicatedJobs/*/template/spec/template/metadata/annotations``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localdev.cluster.crds import load_yaml_file

#: The shipped runtime file of ``torch-distributed`` (under the bundle's manifests).
TORCH_DISTRIBUTED = Path("trainer") / "runtimes" / "torch_distributed.yaml"
#: The pod annotation that makes the scraper read the trainer container's log.
LOG_SOURCE = {"trainjob-progress.dev/source": "logs"}


def annotated_runtime(manifests: Path, name: str, annotations: Mapping[str, str],
                      base: Path = TORCH_DISTRIBUTED) -> dict[str, Any]:
    """The shipped runtime ``base`` named ``name``, ``annotations`` on every pod template."""
    runtime = copy.deepcopy(load_yaml_file(manifests / base))
    runtime["metadata"] = {"name": name}
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        meta = job["template"]["spec"]["template"].setdefault("metadata", {})
        meta.setdefault("annotations", {}).update(annotations)
    return runtime
