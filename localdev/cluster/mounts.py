"""Private mount namespaces: a process of the local cluster sees files at the paths
a container would, without changing the host's filesystem view.

Used by :class:`localdev.cluster.stack.Cluster` for the Trainer controller's
compiled-in certificate and ServiceAccount directories, and by the pod runner
(:mod:`localdev.cluster.podrunner`) for a pod's volumes and its hosts file.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

#: Runs ``$@`` after bind-mounting pairs of words (source, target); $1 is the pair count.
#: A missing target directory is created first (an empty mount point, as a container
#: runtime makes one).
_BIND_SCRIPT = ('n=$1; shift; while [ "$n" -gt 0 ]; do '
                '{ [ -e "$2" ] || mkdir -p "$2"; } && mount --bind "$1" "$2" || exit 127; '
                'shift 2; n=$((n - 1)); done; exec "$@"')


def with_bind_mounts(prefix: Sequence[str], binds: Sequence[tuple[Path | str, Path | str]],
                     args: Sequence[str]) -> list[str]:
    """``args`` run in a private mount namespace (``prefix``, :func:`private_mount_prefix`)
    where each ``(source, target)`` of ``binds`` is bind-mounted first.

    A missing target directory is created (an empty mount point, as a container
    runtime does); the mounts are seen by that process only.  ``unshare`` and
    ``sh`` both exec, so the process id is that of ``args``' program.  A failed
    mount exits 127 before ``args`` runs.
    """
    words = [str(w) for pair in binds for w in pair]
    return [*prefix, "sh", "-c", _BIND_SCRIPT, "sh", str(len(binds)), *words, *args]


@functools.cache
def private_mount_prefix() -> tuple[str, ...] | None:
    """The ``unshare`` words that give a process a private mount namespace, or None.

    As root ``unshare --mount``; otherwise through a user namespace where the
    kernel allows it.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    for words in ((unshare, "--mount", "--propagation", "private"),
                  (unshare, "--user", "--map-root-user", "--mount", "--propagation", "private")):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            if subprocess.run([*words, "true"], capture_output=True, timeout=10).returncode == 0:
                return words
    return None
