"""The write stage of the scraper: statuses in, ``TrainJob.status.trainerStatus`` out
by server-side apply, only on change, under an API budget.  One module per job:

* :mod:`.writer`: :class:`~scraper.write.writer.StatusWriter`, the stage's entry (the
  scrape loop's ``apply``): decides at once whether a status is news and queues it;
  drift; wires the modules below;
* :mod:`.policy`: writing by significance (progress floor, metrics staleness, the
  TrainJob's and pod's annotations);
* :mod:`.rules`: the rule for other writers and time, as pure decisions;
  :mod:`.deferral` applies it with its count and log;
* :mod:`.queue`: one pending status per TrainJob, priorities, aging, retries;
  :mod:`.order`: the queue's O(log n) indexes;
* :mod:`.worker`: the writer tasks: the apply request, the write budget, retries, 409s,
  a TrainJob gone;
* :mod:`.rate_rule` and :mod:`.rate`: the adaptive write rate (an AIMD rule between
  ``--write-qps`` and ``--write-qps-max``, and the token bucket that follows it);
* :mod:`.notices`: the Events and log lines told once per TrainJob (CRD without
  ``trainerStatus``, ``ClockSkew``);
* :mod:`.outcome`: what a write came to (the metrics label), the field manager.
"""
