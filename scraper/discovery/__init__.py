"""Discovery, the first stage: which pods to scrape and which TrainJob each belongs to.

The pod and TrainJob informers' items in (:mod:`scraper.discovery.pods`,
:mod:`scraper.shared.trainjobs`), one :class:`~scraper.shared.targets.Target` per
rank-0 trainer pod out, with its identity checked against the TrainJob it names
(:mod:`scraper.discovery.identity`) and its deletion request remembered
(:mod:`scraper.discovery.deletions`).  :mod:`scraper.scrape` schedules what it finds.
"""
