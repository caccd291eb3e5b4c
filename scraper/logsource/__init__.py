"""Progress from a training's own output, read through the pods/log API.

For trainings nobody instrumented: the scraper reads the rank-0 trainer
container's log and turns what the training's framework prints into a
TrainerStatus.  One module per job:

* :mod:`.segments`: a pods/log answer (``timestamps=true``) into timed text segments
  (a ``\\r`` redraw or a ``\\n`` line each), cleaned of ANSI codes and bounded;
* :mod:`.numbers`: the number, duration and metric-name rules the parsers share;
* one parser per format: :mod:`.tqdm_bar` (tqdm, ``tqdm.auto``, the Transformers
  Trainer's bar, Lightning's TQDMProgressBar), :mod:`.rich_bar` (Lightning's
  RichProgressBar), :mod:`.keras_bar` (Keras 3 ``verbose=1`` and ``2``),
  :mod:`.trainer_dicts` (the Transformers Trainer's logged metric dicts),
  :mod:`.katib` (Katib's ``name=value`` lines);
* :mod:`.progress`: per-target state, the newest complete reading, the rules of which
  bar counts, and the TrainerStatus built from it;
* :mod:`.reader`: the bounded reads (``tailLines``, ``limitBytes``, ``sinceTime``).
"""
