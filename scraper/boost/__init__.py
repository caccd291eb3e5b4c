"""Checkpoint-aware preemption: the work a preemption would throw away, as a Kueue
Workload's priority boost (docs/preemption.md).

* :mod:`.rule` - the work at risk and the boost it maps to (pure functions);
* :mod:`.workload` - a TrainJob's Workload (by owner reference), its admitted
  resources, and the annotation write;
* :mod:`.watch` - the leader's periodic pass that keeps every boost current.
"""
