"""A training that floods its log: a tqdm bar redrawn at every step plus long log lines.

Environment: ``SECONDS`` (default 30) of flooding, ``LINE_BYTES`` (default 4096) per
extra line, one every ``LINE_EVERY`` steps (default 20); it prints as fast as it can.
"""

import os
import sys
import time

from tqdm import tqdm

seconds = float(os.environ.get("SECONDS", "30"))
line = "log line " + "z" * int(os.environ.get("LINE_BYTES", "4096"))
every = int(os.environ.get("LINE_EVERY", "20"))
total = 10**9
end = time.monotonic() + seconds
bar = tqdm(total=total, mininterval=0, miniters=1, desc="flood")
step = 0
while time.monotonic() < end:
    step += 1
    bar.update(1)
    bar.set_postfix(loss=1.0 / step, refresh=False)
    if step % every == 0:
        bar.write(line, file=sys.stderr)
bar.close()
print(f"steps={step}")
