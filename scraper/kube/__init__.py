"""Kubernetes plumbing of the scraper: knows the API, nothing of trainers.

* :mod:`scraper.kube.client`: loading the client; the one request timeout.
* :mod:`scraper.kube.calls`: the one call path (thread hop, rate limit, retries,
  backoff, ``Retry-After``).
* :mod:`scraper.kube.events`: Events on TrainJobs.
* :mod:`scraper.kube.crd`: whether the TrainJob CRD can store ``status.trainerStatus``.
"""
