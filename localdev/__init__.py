"""Local development environment: the local cluster and the demo.

Not part of the product: the wheel and the container image ship only ``scraper`` and
``exporter_lib``.  ``scripts/bootstrap`` puts the repository root on the virtual
environment's path so this package imports from a checkout.

* :mod:`localdev.cluster` builds and runs the local control plane (and Prometheus).
* :mod:`localdev.demo` is ``make demo`` (``python -m localdev.demo``).
"""
