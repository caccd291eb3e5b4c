"""Stall detection beside the pipeline: a training that runs and answers but stopped moving.

:mod:`scraper.stall.rule` is the rule (no I/O), :mod:`scraper.stall.watch` applies it
to every target each few seconds (Events, gauges) and :mod:`scraper.stall.marker`
writes the ``trainjob-progress.dev/stalled-since`` annotation.
"""
