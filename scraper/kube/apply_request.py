"""One server-side apply PATCH through the official client's connection pool.

:meth:`kubernetes.client.ApiClient.call_api` spends about a quarter of a status
write's CPU in this process on generic work a pre-encoded apply body does not need
(parameter sanitising and templating, header tuple lists, ``PoolManager`` URL parsing,
a UTF-8 decode of the answer before it is parsed again).  :func:`apply_patch` sends
the same request with the client's own pieces, so TLS, proxy, client certificates
and credentials stay exactly the client's:

* the connection pool of ``api_client.rest_client`` (read at every call:
  :func:`scraper.kube.client.without_retries` may replace it), with its retry
  setting;
* the credentials of ``ApiClient.update_params_for_auth`` at every call (so a token
  that the configuration's ``refresh_api_key_hook`` renews, e.g. the in-cluster
  ServiceAccount token, is the current one) and the client's default headers;
* the client's error type: a non-2xx answer raises
  :class:`kubernetes.client.exceptions.ApiException` with status, reason, headers
  and body, as ``call_api`` does.  A TLS error stays the
  ``urllib3.exceptions.SSLError`` it is (``call_api`` turns it into an
  ``ApiException`` with status 0), so callers treat it as a connection error.

Measured with ``python -m benchmarks.breakdown --writes`` (README, performance).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.client.rest import RESTResponse

from scraper.kube.apply_body import APPLY_CONTENT_TYPE

__all__ = ["apply_patch"]

_CONTENT_HEADERS = {"Content-Type": APPLY_CONTENT_TYPE, "Accept": "application/json"}


def apply_patch(api_client: ApiClient, path: str, query: list[tuple[str, str]],
                body: bytes, *, timeout: tuple[float, float]) -> dict[str, Any]:
    """PATCH ``body`` (an encoded apply body) to ``path`` and return the answer's object.

    Blocking; runs in a worker thread.

    Args:
        path: the request path, its segments already percent-encoded where needed
            (Kubernetes names are DNS labels/subdomains: nothing to encode).
        query: query parameters, e.g. ``[("fieldManager", ...), ("force", "true")]``.
        timeout: ``(connect, read)`` seconds.

    Raises:
        ApiException: the API server answered outside 2xx.
        urllib3.exceptions.HTTPError: connect/read timeout, TLS or protocol error.
        ValueError: a 2xx answer that is not a JSON object.
    """
    headers = {**api_client.default_headers, **_CONTENT_HEADERS}
    if api_client.cookie:
        headers["Cookie"] = api_client.cookie
    params = list(query)
    api_client.update_params_for_auth(headers, params, ["BearerToken"])
    url = f"{api_client.configuration.host}{quote(path)}?{urlencode(params)}"
    resp = api_client.rest_client.pool_manager.request(
        "PATCH", url, body=body, headers=headers,
        timeout=urllib3.Timeout(connect=timeout[0], read=timeout[1]))
    if not 200 <= resp.status <= 299:
        raise ApiException(http_resp=RESTResponse(resp))
    result = json.loads(resp.data)
    if not isinstance(result, dict):
        raise ValueError(f"apply answer of {path}: a JSON {type(result).__name__}, "
                         "expected an object")
    return result
