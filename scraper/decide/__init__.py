"""The decide stage: :func:`scraper.decide.decision.decide`, one pure function of what a
TrainJob holds, a report, the write policy and the time, says whether the report is
written, waits until a time, or is skipped.  :mod:`.others` is its rule for other
writers."""
