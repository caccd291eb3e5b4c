"""The lines frameworks print when they save a checkpoint.

* Transformers ``Trainer._save``: ``Saving model checkpoint to <dir>`` (an INFO record of
  the ``transformers.trainer`` logger, printed when the training logs at INFO);
* Lightning ``ModelCheckpoint(monitor=..., verbose=True)``: ``Epoch 0, global step 10:
  'val_loss' reached 0.5 (best 0.5), saving model to '<path>' as top 1`` (Lightning 2.x
  prints nothing for a save without a monitor);
* Keras ``ModelCheckpoint(verbose=1)``: ``Epoch 1: saving model to <path>`` or
  ``Epoch 1: val_loss improved from inf to 0.5, saving model to <path>``.

A save the framework does not print (Transformers below INFO, ``verbose`` off) is not
seen here: the exporter's callbacks report every save.  Lines that say a checkpoint was
*not* saved (``was not in top 1``, ``did not improve``) do not match.
"""

from __future__ import annotations

import re

# Linear: fixed words around one optional word; searched in a segment of bounded length.
_SAVE = re.compile(r"\b[Ss]aving model (?:checkpoint )?to\s")


def is_save(text: str) -> bool:
    """True when ``text`` (one cleaned segment) is a framework's checkpoint-save line."""
    return "aving model" in text and _SAVE.search(text) is not None
