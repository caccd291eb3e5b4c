"""Scheduling and scraping, the second stage: targets in, statuses for the writer out.

:mod:`scraper.scrape.manager` keeps one scrape loop per target
(:mod:`scraper.scrape.target_table`, :mod:`scraper.scrape.scheduling`);
:mod:`scraper.scrape.loop` applies the rules of one run; a run reads the target's
exporter (:mod:`scraper.scrape.exporter` over :mod:`scraper.scrape.http_exchange`) or
its log (:mod:`scraper.logsource`), as :mod:`scraper.scrape.sources` picks.  A changed
status from an exporter that states no pod is written only once
:mod:`scraper.discovery.pod_confirm` has read the pod again.  What it reads goes to
:mod:`scraper.write`.
"""
