"""The write stage of the scraper: decided statuses in, ``TrainJob.status.trainerStatus``
out by server-side apply, under an API budget.  One module per job:

* :mod:`.writer`: :class:`~scraper.write.writer.StatusWriter`, the stage's entry (the
  scrape loop's ``apply``): asks the one decision (:mod:`scraper.decide`) and queues
  what it says to write; drift; wires the modules below;
* :mod:`.deferral`: reports another writer keeps out, counted and logged;
* :mod:`.queue`: one pending status per TrainJob, priorities, aging, retries;
  :mod:`.order`: the queue's O(log n) indexes;
* :mod:`.worker`: the writer tasks: the apply request, the write budget, retries, 409s,
  a TrainJob gone;
* :mod:`.rate_rule` and :mod:`.rate`: the adaptive write rate (an AIMD rule between
  ``--write-qps`` and ``--write-qps-max``, and the token bucket that follows it);
* :mod:`.notices`: the ``lastUpdatedTime`` written (never back in time silently) and
  the Events and log lines told once per TrainJob (CRD without ``trainerStatus``,
  ``ClockSkew``);
* :mod:`.annotation_target`: where a write goes (``status.trainerStatus`` or the
  annotation), its path and body.

The write policy and what a write came to are on the floor below the stages
(:mod:`scraper.shared.policy`, :mod:`scraper.shared.outcome`).
"""
