"""Server-side apply requests: the body, encoded so the API server reads it exactly, and
the PATCH on the event loop (aiohttp), set up from the official client.

**The PATCH.**

A status write through the official client's blocking urllib3 request in a worker
thread cost about 1.7-2.1 ms of this process's CPU; the same PATCH with aiohttp on
the event loop 1.1-1.2 ms (4 writes at once against the local kube-apiserver; ``python
-m benchmarks.breakdown --writes``, README): the thread hand-off, the GIL passing
between threads and ``http.client``'s pure-Python response parsing are gone.  Every
other Kubernetes call stays on the official client (:func:`scraper.kube.calls.call`).

What is taken from the client's :class:`kubernetes.client.Configuration`, as its
``rest.RESTClientObject`` takes it:

* ``host``; TLS: ``ssl_ca_cert`` (certifi's bundle when unset), ``cert_file`` and
  ``key_file`` (client certificate), ``verify_ssl`` false (no verification),
  ``assert_hostname`` false (no hostname check) or a name, and ``tls_server_name``
  (the name sent and checked; an ``assert_hostname`` name is also sent as SNI here);
* ``proxy`` and ``proxy_headers`` unless ``no_proxy`` covers the host;
* credentials from ``ApiClient.update_params_for_auth``, read in a worker thread at
  most every :data:`CREDENTIALS_SECONDS` and again after a 401 (the configuration's
  ``refresh_api_key_hook`` may run an exec credential plugin, a blocking subprocess of
  up to seconds, at every read in a token's last 5 minutes: on the loop it stalled
  every scrape), so a token the hook renews (the in-cluster ServiceAccount token, an
  exec plugin's) is used within that time; the client's default headers and cookie.

Errors: a non-2xx answer raises :class:`kubernetes.client.exceptions.ApiException`
with status, reason, headers and body as the client's would; a connection, TLS or
protocol error raises :class:`ConnectionError`, a timeout :class:`TimeoutError`.

**The body.** kube-apiserver takes apply patches as ``application/apply-patch+yaml`` (a
CBOR form exists only behind an alpha feature gate); the body goes through
``sigs.k8s.io/yaml`` (go-yaml) and then into JSON.  JSON is YAML, but not every JSON
spelling of a string reads back the same in YAML:

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
(:data:`exporter_lib.status.NOT_UNICODE`), and :func:`encode_apply_body` raises
``ValueError``.

Source of the body's rules: YAML 1.2 section 5.1 (c-printable), 5.4 (line breaks), go-yaml's
``scannerc.go`` (escape decoding).
"""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import time
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import certifi
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from requests.utils import should_bypass_proxies

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


__all__ = ["ApplyClient", "ssl_context"]

_CONTENT_HEADERS = {"Content-Type": APPLY_CONTENT_TYPE, "Accept": "application/json"}
#: Seconds the credentials read for a request are reused (the in-cluster loader of the
#: official client re-reads its token file once a minute).
CREDENTIALS_SECONDS = 10.0


def ssl_context(api_client: ApiClient) -> ssl.SSLContext:
    """The TLS settings of ``api_client``'s configuration (module doc) as an SSLContext.

    Raises:
        OSError: a certificate or key file cannot be read.
        ssl.SSLError: a file is not a certificate or key.
    """
    cfg = api_client.configuration
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or certifi.where())
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        ctx.check_hostname = False
    return ctx


class ApplyClient:
    """Apply PATCHes to the API server of ``api_client`` (module doc).

    Args:
        api_client: read for host, TLS, proxy and credentials (the last at every request).
        connections: most connections kept open to the API server (one per writer).
    """

    def __init__(self, api_client: ApiClient, *, connections: int) -> None:
        self._api = api_client
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        cfg = api_client.configuration
        self._proxy = (cfg.proxy if cfg.proxy and not should_bypass_proxies(
            cfg.host, no_proxy=cfg.no_proxy or "") else None)
        name = cfg.tls_server_name or (cfg.assert_hostname
                                       if isinstance(cfg.assert_hostname, str) else None)
        self._server_hostname: str | None = name or None
        self._auth: tuple[dict[str, str], list[tuple[str, str]]] | None = None
        self._auth_at = 0.0
        self._auth_lock = asyncio.Lock()

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            https = self._api.configuration.host.startswith("https:")
            connector = aiohttp.TCPConnector(
                limit=self._connections, ssl=ssl_context(self._api) if https else False)
            # Nothing but the request's own headers: no User-Agent of aiohttp's.
            self._session = aiohttp.ClientSession(
                connector=connector, skip_auto_headers=("User-Agent",),
                cookie_jar=aiohttp.DummyCookieJar())
        return self._session

    async def patch(self, path: str, query: list[tuple[str, str]], body: bytes, *,
                    request_timeout: tuple[float, float]) -> dict[str, Any]:
        """PATCH ``body`` (an encoded apply body) to ``path``; the answer's object.

        Args:
            path: the request path (percent-encoded here).
            query: query parameters, e.g. ``[("fieldManager", ...), ("force", "true")]``.
            request_timeout: ``(connect, read)`` seconds; read bounds the wait between two
                reads (the caller's deadline bounds the whole answer).

        Raises:
            ApiException: the API server answered outside 2xx.
            ConnectionError: connect, TLS or protocol error.
            TimeoutError: connect or read timeout.
            ValueError: a 2xx answer that is not a JSON object.
        """
        cfg = self._api.configuration
        auth_headers, auth_query = await self._credentials()
        headers = {**self._api.default_headers, **_CONTENT_HEADERS, **auth_headers}
        if self._api.cookie:
            headers["Cookie"] = self._api.cookie
        url = f"{cfg.host}{quote(path)}?{urlencode([*query, *auth_query])}"
        try:
            async with self._open().patch(
                    url, data=body, headers=headers, proxy=self._proxy,
                    proxy_headers=cfg.proxy_headers if self._proxy else None,
                    server_hostname=self._server_hostname,
                    timeout=aiohttp.ClientTimeout(sock_connect=request_timeout[0],
                                                  sock_read=request_timeout[1])) as resp:
                data = await resp.read()
                status, reason, answer_headers = resp.status, resp.reason, resp.headers
        except TimeoutError:  # aiohttp's timeouts are ClientErrors too: they stay timeouts
            raise
        except aiohttp.ClientError as exc:
            raise ConnectionError(f"apply PATCH {path}: {type(exc).__name__}: {exc}") from exc
        if not 200 <= status <= 299:
            if status == 401:
                self._auth = None  # read the credentials again for the next try
            err = ApiException(status=status, reason=reason)
            err.body, err.headers = data, answer_headers
            raise err
        result = json.loads(data)
        if not isinstance(result, dict):
            raise ValueError(f"apply answer of {path}: a JSON {type(result).__name__}, "
                             "expected an object")
        return result

    async def _credentials(self) -> tuple[dict[str, str], list[tuple[str, str]]]:
        """The auth headers and query parameters of the client's configuration (module
        doc); read off the loop, shared by the writers while fresh."""
        async with self._auth_lock:
            if self._auth is None or time.monotonic() - self._auth_at >= CREDENTIALS_SECONDS:
                self._auth = await asyncio.to_thread(self._read_credentials)
                self._auth_at = time.monotonic()
            return self._auth

    def _read_credentials(self) -> tuple[dict[str, str], list[tuple[str, str]]]:
        headers: dict[str, str] = {}
        query: list[tuple[str, str]] = []
        self._api.update_params_for_auth(headers, query, ["BearerToken"])
        return headers, query

    async def close(self) -> None:
        """Close the connections (a later :meth:`patch` opens new ones)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
