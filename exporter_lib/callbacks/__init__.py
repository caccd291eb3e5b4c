"""Framework callbacks; each submodule imports its framework, this package imports none.

* :mod:`exporter_lib.callbacks.transformers` - Hugging Face ``TrainerCallback``.
* :mod:`exporter_lib.callbacks.lightning` - PyTorch Lightning ``Callback``.
* :mod:`exporter_lib.callbacks.keras` - Keras ``Callback``.
"""
