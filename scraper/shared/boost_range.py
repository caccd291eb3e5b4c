"""The accepted range of the priority boost, shared by the settings and the boost stage."""

#: The largest range accepted: Kueue reads the ``kueue.x-k8s.io/priority-boost``
#: annotation as an int32 and adds it to an int32 priority (Kueue v0.17.0,
#: ``pkg/util/priority/priority.go``); a range this size already spans 2**1000000
#: resource-minutes.
MAX_BOOST_LIMIT = 1_000_000
