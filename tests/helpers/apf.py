"""API Priority and Fairness objects for tests that make a real kube-apiserver answer 429
(tests/scraper/test_write_rate_apf.py, tests/scraper/test_write_rate_writer_apf.py)."""

from __future__ import annotations


def tiny_level(name: str) -> dict[str, object]:
    """A PriorityLevelConfiguration of no seats of its own (``nominalConcurrencyShares:
    0``, no lending or borrowing) that rejects at once: kube-apiserver v1.37.2 still runs
    one of its requests at a time (measured), and answers 429 to a second."""
    return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1",
            "kind": "PriorityLevelConfiguration", "metadata": {"name": name},
            "spec": {"type": "Limited", "limited": {
                "nominalConcurrencyShares": 0, "lendablePercent": 0,
                "borrowingLimitPercent": 0, "limitResponse": {"type": "Reject"}}}}


def flow_schema(name: str, level: str, namespace: str, account: str) -> dict[str, object]:
    """A FlowSchema putting every request of ServiceAccount ``namespace/account`` in
    ``level`` (precedence 100: before kube-apiserver's own, 9000 for service accounts)."""
    return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {"priorityLevelConfiguration": {"name": level},
                     "matchingPrecedence": 100,
                     "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                         "namespace": namespace, "name": account}}],
                         "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"],
                                            "resources": ["*"], "namespaces": ["*"]}]}]}}
