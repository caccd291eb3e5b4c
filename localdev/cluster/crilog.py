"""Container output stored as a node's runtime stores it: the CRI log format.

A CRI log file holds one entry per line, ``<RFC3339Nano> <stream> <P|F> <content>\\n``
(the format is the Kubernetes CRI's "container log" format; the kubelet's reader,
``k8s.io/cri-client/pkg/logs``, which kwok's server uses, parses it).  How output is
split into entries follows containerd's CRI logger (``redirectLogs``):

* ``\\n`` ends a line: the line's bytes become a full (``F``) entry, without the
  ``\\n`` (a ``\\r`` right before it is dropped too, as ``bufio.Reader.ReadLine``
  does); any other ``\\r`` stays inside the content;
* a line longer than :data:`MAX_LINE_BYTES` (containerd's default
  ``max_container_log_line_size``, 16 KiB) is cut into partial (``P``) entries of
  exactly that many bytes, the rest continuing the line;
* output that ends without ``\\n`` (the stream closed) is written as a ``P`` entry.

Each entry's timestamp is the time it is written (nanoseconds, UTC).  Entries
are written whole, one ``write`` each, so the kubelet's reader never sees half
of one.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

#: containerd's default ``max_container_log_line_size`` (bytes of content per entry).
MAX_LINE_BYTES = 16 * 1024
STDOUT, STDERR = "stdout", "stderr"
PARTIAL, FULL = b"P", b"F"


def timestamp(ns: int | None = None) -> str:
    """``ns`` (nanoseconds since the epoch, default now) as Go's ``time.RFC3339Nano`` in UTC.

    Trailing zeros of the fraction are dropped, as Go formats it.
    """
    ns = time.time_ns() if ns is None else ns
    seconds, fraction = divmod(ns, 1_000_000_000)
    text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
    digits = f"{fraction:09d}".rstrip("0")
    return f"{text}.{digits}Z" if digits else f"{text}Z"


class CriLogWriter:
    """Splits two streams' bytes into CRI entries appended to one file.

    Thread-safe: one thread per stream may call :meth:`feed`.  ``plain``, when
    given, receives the raw bytes as they arrive (both streams), for readers of
    the plain log such as the termination message's fallback.
    """

    def __init__(self, path: Path, plain: BinaryIO | None = None,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.plain = plain
        self._max = max_line_bytes
        self._lock = threading.Lock()
        self._pending: dict[str, bytearray] = {STDOUT: bytearray(), STDERR: bytearray()}

    def feed(self, stream: str, data: bytes) -> None:
        """Take ``data`` read from ``stream``; write every entry it completes."""
        buf = self._pending[stream]
        buf += data
        with self._lock:
            if self.plain is not None:
                self.plain.write(data)
                self.plain.flush()
            start = 0
            while True:
                newline = buf.find(b"\n", start)
                end = newline if newline >= 0 else len(buf)
                if end - start > self._max:
                    self._entry(stream, PARTIAL, buf[start:start + self._max])
                    start += self._max
                    continue
                if newline < 0:
                    break
                line_end = newline - 1 if newline > start and buf[newline - 1] == 0x0D \
                    else newline
                self._entry(stream, FULL, buf[start:line_end])
                start = newline + 1
            del buf[:start]

    def close_stream(self, stream: str) -> None:
        """The stream ended: what is left without ``\\n`` becomes a ``P`` entry."""
        buf = self._pending[stream]
        with self._lock:
            if buf:
                self._entry(stream, PARTIAL, bytes(buf))
                buf.clear()

    def close(self) -> None:
        """Flush both streams and close the file."""
        for stream in (STDOUT, STDERR):
            self.close_stream(stream)
        with self._lock:
            os.close(self._fd)

    def _entry(self, stream: str, tag: bytes, content: bytes | bytearray) -> None:
        head = f"{timestamp()} {stream} ".encode()
        os.write(self._fd, b"".join((head, tag, b" ", content, b"\n")))


def pump(fd: int, stream: str, writer: CriLogWriter, chunk: int = 64 * 1024) -> None:
    """Read ``fd`` until EOF into ``writer`` as ``stream``; closes ``fd``."""
    try:
        while True:
            try:
                data = os.read(fd, chunk)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
            writer.feed(stream, data)
    finally:
        writer.close_stream(stream)
        os.close(fd)


def parse_entry(line: bytes) -> tuple[str, str, bool, bytes]:
    """One CRI entry (without its ``\\n``) as ``(timestamp, stream, partial, content)``.

    Raises:
        ValueError: not ``<time> <stream> <P|F> <content>``.
    """
    parts = line.split(b" ", 3)
    if len(parts) < 3 or parts[1] not in (b"stdout", b"stderr") or parts[2] not in (b"P", b"F"):
        raise ValueError(f"not a CRI log entry: {line[:80]!r}")
    return (parts[0].decode(), parts[1].decode(), parts[2] == b"P",
            parts[3] if len(parts) > 3 else b"")
