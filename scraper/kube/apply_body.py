"""The body of a server-side apply request, encoded so the API server reads it exactly.

kube-apiserver takes apply patches as ``application/apply-patch+yaml`` (a CBOR form
exists only behind an alpha feature gate); the body goes through ``sigs.k8s.io/yaml`` (go-yaml) and
then into JSON.  JSON is YAML, but not every JSON spelling of a string reads back the
same in YAML:

* a character outside the Basic Multilingual Plane written as a JSON surrogate-pair
  escape (``\\ud83d\\ude80``) is refused: a YAML ``\\u`` escape is one code point, and
  go-yaml answers "found invalid Unicode character escape code" (the whole write is
  refused with HTTP 400);
* raw U+0085, U+2028 and U+2029 are YAML line breaks: inside a quoted scalar they are
  folded into a space;
* raw characters outside YAML's printable set (C0/C1 controls, U+FFFE, U+FFFF) are
  refused, and a raw U+FEFF is a byte order mark to the reader.

So :func:`encode_apply_body` writes raw UTF-8 for every character YAML reads as itself
(``ensure_ascii=False``, so astral characters are four UTF-8 bytes, never an escape)
and a one-code-point ``\\uXXXX`` escape, valid in both JSON and YAML, for every BMP
character it would not.  A lone surrogate has no encoding at all (UTF-8 refuses it);
the status model refuses it before it gets here
(:data:`exporter_lib.status.NOT_UNICODE`), and this module raises ``ValueError``.

Source of the rules: YAML 1.2 section 5.1 (c-printable), 5.4 (line breaks), go-yaml's
``scannerc.go`` (escape decoding).
"""

from __future__ import annotations

import json
import re
from typing import Any

#: Content-Type of the request.  The charset parameter is also what keeps the Kubernetes
#: client from re-encoding the bytes (it JSON-dumps bodies of the bare media type).
APPLY_CONTENT_TYPE = "application/apply-patch+yaml; charset=utf-8"

# Characters the YAML reader does not read as themselves, in a JSON text already
# produced with ensure_ascii=False (which escapes only '"', '\\' and U+0000..U+001F).
_NOT_YAML_SAFE = re.compile("[\u007f-\u009f\u2028\u2029\ufeff\ufffe\uffff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def encode_apply_body(body: dict[str, Any]) -> bytes:
    """``body`` as compact UTF-8 JSON text that go-yaml decodes to the same strings.

    Raises:
        ValueError: a string holds a lone surrogate (no Unicode text can carry it).
    """
    text = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    text = _NOT_YAML_SAFE.sub(_escape, text)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"apply body holds a lone surrogate at character {exc.start}: "
                         "not Unicode text") from None
