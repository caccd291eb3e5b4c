"""The scrape's own HTTP exchange (scraper/scrape/http_exchange.py) against answers of any shape.

A raw asyncio server on 127.0.0.1 writes exactly the bytes the test chose (heads split
anywhere, chunked bodies, bodies past the cap, garbage, a close before the end), and the
real :class:`~scraper.scrape.http_exchange.ConnectionPool` reads them.  Rules checked: a
well-formed answer gives its body whole whatever its framing and however it is split;
a connection is pooled only when the answer ended cleanly and allows keep-alive; a
malformed or cut-short answer raises :class:`BadAnswer` and is never pooled; a body past
the cap raises :class:`BodyTooLarge` and closes the connection; a pooled connection
closed before any byte of the answer is :class:`StaleConnection` (a fresh one never is);
a cancelled exchange closes its connection.  Through :class:`ExporterScraper`: the same
answers end in typed results, never an exception.

Bounded: hypothesis examples are capped, every exchange has a 2 s timeout, each server
lives for one example.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scraper.scrape.exporter import ExporterScraper, ScrapeLimits
from scraper.scrape.http_exchange import (
    HEAD_MAX_BYTES,
    BadAnswer,
    BodyTooLarge,
    ConnectionPool,
    ExchangeError,
    StaleConnection,
    endpoint,
)
from scraper.shared.scrapes import Failure, FailureKind, Fresh, NotModified
from scraper.shared.targets import Target

pytestmark = pytest.mark.timeout(120)

CAP = 4096
LIMIT = 2.0
EXAMPLES = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

#: What a server does with one connection: gets the reader and writer.
Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawServer:
    """A loopback server running ``serve`` per connection; counts connections closed."""

    def __init__(self, serve: Serve) -> None:
        self.serve = serve
        self.opened = 0
        self.ended = 0  # connections whose client end was seen closing
        self.one_ended = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def __aenter__(self) -> RawServer:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.opened += 1
            try:
                await self.serve(reader, writer)
                # Wait (bounded) for the client to close its end.
                async with asyncio.timeout(LIMIT):
                    while await reader.read(65536):
                        pass
                self._end()
            except OSError:  # the client closed while this side still wrote
                self._end()
            except TimeoutError:
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _end(self) -> None:
        self.ended += 1
        self.one_ended.set()

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    """One request head (GET has no body)."""
    return await reader.readuntil(b"\r\n\r\n")


def answer_of(pieces: list[bytes], close: bool = False, requests: int = 1) -> Serve:
    """A server answering ``requests`` requests, each with ``pieces`` written one by one
    (drained between), then closing when ``close``."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for _ in range(requests):
            await read_request(reader)
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                await asyncio.sleep(0)
        if close:
            writer.close()
    return serve


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def framed(body: bytes, framing: str, chunks: list[int], extra: bytes = b"") -> bytes:
    """A 200 answer carrying ``body`` as ``framing`` says (``length``, ``chunked``,
    ``close``: delimited by the connection's end)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra
    if framing == "length":
        return head + b"Content-Length: %d\r\n\r\n" % len(body) + body
    if framing == "chunked":
        out = head + b"Transfer-Encoding: chunked\r\n\r\n"
        for piece in split(body, chunks):
            out += b"%x\r\n" % len(piece) + piece + b"\r\n"
        return out + b"0\r\n\r\n"
    return head + b"Connection: close\r\n\r\n" + body


@contextlib.asynccontextmanager
async def a_pool() -> AsyncIterator[ConnectionPool]:
    """A pool of 4 connections in use at most, closed at the end."""
    pool = ConnectionPool(4)
    try:
        yield pool
    finally:
        await pool.close()


async def bad_answer_never_pooled(parts: list[bytes]) -> None:
    """A server sends ``parts`` and closes: the GET raises BadAnswer, nothing is pooled."""
    async with RawServer(answer_of(parts, close=True)) as server, a_pool() as pool:
        with pytest.raises(BadAnswer):
            await get_once(server.port, pool)
        assert pool.idle_count() == 0


async def get_once(port: int, pool: ConnectionPool, cap: int = CAP,
                   fresh: bool = False) -> tuple[int, dict[str, str], bytes]:
    where = endpoint(f"http://127.0.0.1:{port}/metrics", "test")
    async with asyncio.timeout(LIMIT):
        resp = await pool.get(where, {"Accept": "application/json"}, cap, fresh=fresh)
        try:
            body = await resp.read()
            return resp.status, resp.headers, body
        finally:
            resp.release()


@EXAMPLES
@given(body=st.binary(max_size=CAP), framing=st.sampled_from(["length", "chunked", "close"]),
       chunks=st.lists(st.integers(0, CAP), max_size=6),
       cuts=st.lists(st.integers(0, 2 * CAP), max_size=8))
def test_a_well_formed_answer_gives_its_body_whole(body: bytes, framing: str,
                                                   chunks: list[int],
                                                   cuts: list[int]) -> None:
    raw = framed(body, framing, chunks)

    async def check() -> None:
        serve = answer_of(split(raw, cuts), close=framing == "close")
        async with RawServer(serve) as server, a_pool() as pool:
            status, headers, got = await get_once(server.port, pool)
            assert (status, got) == (200, body)
            assert headers["content-type"] == "application/json"
            # Pooled only when the framing lets the connection serve another answer.
            assert pool.idle_count() == (0 if framing == "close" else 1)

    asyncio.run(check())


@EXAMPLES
@given(size=st.integers(CAP + 1, 3 * CAP), framing=st.sampled_from(["chunked", "close"]),
       chunks=st.lists(st.integers(0, 3 * CAP), max_size=6),
       cuts=st.lists(st.integers(0, 4 * CAP), max_size=6))
def test_a_body_past_the_cap_fails_and_closes(size: int, framing: str, chunks: list[int],
                                              cuts: list[int]) -> None:
    raw = framed(b"x" * size, framing, chunks)

    async def check() -> None:
        async with RawServer(answer_of(split(raw, cuts))) as server, a_pool() as pool:
            with pytest.raises(BodyTooLarge, match=f"{CAP}-byte cap"):
                await get_once(server.port, pool)
            assert pool.idle_count() == 0
            # The server sees the connection end.
            await asyncio.wait_for(server.one_ended.wait(), LIMIT)

    asyncio.run(check())


@EXAMPLES
@given(garbage=st.binary(min_size=0, max_size=512).filter(lambda b: not b.startswith(b"H")),
       cuts=st.lists(st.integers(0, 512), max_size=4))
def test_garbage_is_a_bad_answer_never_pooled(garbage: bytes, cuts: list[int]) -> None:
    asyncio.run(bad_answer_never_pooled(split(garbage, cuts)))


@EXAMPLES
@given(body=st.binary(min_size=1, max_size=CAP),
       framing=st.sampled_from(["length", "chunked"]),
       chunks=st.lists(st.integers(0, CAP), max_size=4), data=st.data())
def test_an_answer_cut_short_is_a_bad_answer(body: bytes, framing: str, chunks: list[int],
                                             data: st.DataObject) -> None:
    raw = framed(body, framing, chunks)
    keep = data.draw(st.integers(0, len(raw) - 1), label="bytes sent before the close")

    # On a fresh connection: never taken for a stale one.
    asyncio.run(bad_answer_never_pooled([raw[:keep]]))


@EXAMPLES
@given(name=st.sampled_from(["ETag", "etag", "ETAG", "eTaG"]),
       ctype=st.sampled_from(["application/json", "Application/JSON; charset=utf-8",
                              "application/json ;charset=UTF-8"]),
       how=st.sampled_from([b"HTTP/1.0 200 OK\r\n", b"HTTP/1.1 200 OK\r\nConnection: close\r\n",
                            b"HTTP/1.1 200 OK\r\nconnection: CLOSE\r\n",
                            b"HTTP/1.1 200 OK\r\n"]))
def test_headers_any_case_and_connection_close_honoured(name: str, ctype: str,
                                                        how: bytes) -> None:
    body = b'{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}'
    raw = (how + f'{name}: "v1"\r\nContent-Type: {ctype}\r\n'.encode()
           + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    keeps = how == b"HTTP/1.1 200 OK\r\n"

    async def check() -> None:
        async with RawServer(answer_of([raw], close=not keeps)) as server:
            scraper = ExporterScraper(ScrapeLimits(LIMIT, CAP, 4))
            try:
                target = Target("ns", "job", "p", "uid",
                                f"http://127.0.0.1:{server.port}/metrics", 10.0)
                result = await scraper.scrape(target)
                assert isinstance(result, Fresh), result
                assert result.etag == '"v1"'
                assert scraper._pool.idle_count() == (1 if keeps else 0)
            finally:
                await scraper.close()

    asyncio.run(check())


@pytest.fixture
async def scraper() -> AsyncIterator[ExporterScraper]:
    one = ExporterScraper(ScrapeLimits(LIMIT, CAP, 4))
    yield one
    await one.close()


def _target(port: int) -> Target:
    return Target("ns", "job", "p", "uid", f"http://127.0.0.1:{port}/metrics", 10.0)


OK = framed(b'{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}',
            "length", [])


def stale_after_one() -> tuple[RawServer, Serve]:
    """The first connection answers once, then takes the next request and closes
    without a byte (the exporter ended it while it sat idle); later ones answer."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        first = server.opened == 1
        await read_request(reader)
        writer.write(OK)
        await writer.drain()
        if first:
            await read_request(reader)
            writer.close()

    server = RawServer(serve)
    return server, serve


async def test_a_stale_pooled_connection_is_told_apart() -> None:
    server, _ = stale_after_one()
    async with server, a_pool() as pool:
        assert (await get_once(server.port, pool))[0] == 200
        assert pool.idle_count() == 1
        with pytest.raises(StaleConnection):
            await get_once(server.port, pool)
        assert pool.idle_count() == 0


async def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one(
        scraper: ExporterScraper) -> None:
    server, _ = stale_after_one()
    async with server:
        assert isinstance(await scraper.scrape(_target(server.port)), Fresh)
        assert isinstance(await scraper.scrape(_target(server.port)), Fresh)
        assert server.opened == 2


async def test_a_fresh_connection_closed_without_answer_is_not_retried(
        scraper: ExporterScraper) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.close()

    async with RawServer(serve) as server:
        result = await scraper.scrape(_target(server.port))
        assert isinstance(result, Failure) and result.kind is FailureKind.HTTP_ERROR
        assert "closed the connection before a complete answer" in result.detail
        assert server.opened == 1  # no second try


async def test_a_timed_out_exchange_closes_its_connection(scraper: ExporterScraper) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head + b"{")  # then nothing more
        await writer.drain()

    async with RawServer(serve) as server:
        target = Target("ns", "job", "p", "uid", f"http://127.0.0.1:{server.port}/m", 0.5)
        result = await scraper.scrape(target)
        assert isinstance(result, Failure) and result.kind is FailureKind.TIMEOUT
        assert scraper._pool.idle_count() == 0
        await asyncio.wait_for(server.one_ended.wait(), LIMIT)  # the server saw it end


@pytest.mark.parametrize(("raw", "kind", "detail"), [
    (b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere/\r\nContent-Length: 0\r\n\r\n",
     FailureKind.REDIRECT, "HTTP 302 redirect to http://elsewhere/ (not followed)"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 999999\r\n\r\n", FailureKind.TOO_LARGE,
     f"body of 999999 bytes exceeds the {CAP}-byte cap"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nContent-Length: 13\r\n\r\n",
     FailureKind.HTTP_ERROR, "BadAnswer: malformed HTTP answer"),
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
     FailureKind.HTTP_ERROR, "BadAnswer: the answer switches protocols"),
    (b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", FailureKind.HTTP_ERROR, "HTTP 500"),
])
async def test_answers_that_give_no_status(scraper: ExporterScraper, raw: bytes,
                                           kind: FailureKind, detail: str) -> None:
    async with RawServer(answer_of([raw])) as server:
        result = await scraper.scrape(_target(server.port))
        assert isinstance(result, Failure) and result.kind is kind, result
        assert result.detail.startswith(detail), result.detail


async def test_the_request_sent(scraper: ExporterScraper) -> None:
    seen: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await read_request(reader))
        writer.write(OK)
        await writer.drain()

    async with RawServer(serve) as server:
        assert isinstance(await scraper.scrape(_target(server.port), '"e1"'), Fresh)
    lines = seen[0].decode().split("\r\n")
    assert lines[0] == "GET /metrics HTTP/1.1"
    assert f"Host: 127.0.0.1:{server.port}" in lines
    assert "User-Agent: trainjob-scraper/0.1" in lines
    assert "Accept-Encoding: identity" in lines
    assert 'If-None-Match: "e1"' in lines
    assert any(line.startswith("Accept: application/json") for line in lines)


def test_an_exchange_error_is_one_line() -> None:
    assert issubclass(BadAnswer, ExchangeError) and issubclass(BodyTooLarge, ExchangeError)
    with pytest.raises(ValueError, match="only http"):
        endpoint("https://127.0.0.1/x", "t")


async def test_forget_closes_idle_connections_of_both_pools(scraper: ExporterScraper) -> None:
    answer = (b"HTTP/1.1 304 Not Modified\r\nETag: \"e\"\r\n"
              b"Trainjob-Exporter-Contract: 2;max-wait=5\r\n\r\n")
    async with RawServer(answer_of([answer], requests=1)) as polled, \
            RawServer(answer_of([answer], requests=1)) as held:
        target, other = _target(polled.port), _target(held.port)
        assert isinstance(await scraper.scrape(target), NotModified)
        assert isinstance(await scraper.wait_for_change(other, '"e"', 5.0), NotModified)
        assert scraper._pool.idle_count() == 1
        assert scraper._held_pool is not None and scraper._held_pool.idle_count() == 1
        scraper.forget(target)
        scraper.forget(other)
        assert scraper._pool.idle_count() == 0 and scraper._held_pool.idle_count() == 0
        await asyncio.wait_for(polled.one_ended.wait(), LIMIT)
        await asyncio.wait_for(held.one_ended.wait(), LIMIT)


def test_the_endpoint_of_an_ipv6_url_with_a_query() -> None:
    where = endpoint("http://[fd00::1]:9000/m?x=1", "ua")
    assert (where.host, where.port) == ("fd00::1", 9000)
    assert where.request_head == (b"GET /m?x=1 HTTP/1.1\r\nHost: [fd00::1]:9000\r\n"
                                  b"User-Agent: ua\r\n")


async def test_bytes_past_the_answers_end_change_nothing_of_it_and_are_not_pooled() -> None:
    extra = b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n"
    async with RawServer(answer_of([OK + extra])) as server, a_pool() as pool:
        status, _, body = await get_once(server.port, pool)
        assert status == 200 and body.startswith(b'{"progressPercentage"')
        assert pool.idle_count() == 0


STATUS = b'{"progressPercentage": 5, "lastUpdatedTime": "2025-01-01T00:00:00Z"}'
CHUNKED_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


def _flood(head: bytes, piece: bytes) -> Serve:
    """An answer whose framing never ends: ``head``, then ``piece`` over and over (bounded:
    until the client goes or 10,000 pieces)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head)
        for n in range(10_000):
            writer.write(piece.replace(b"#", str(n).encode()))
            await writer.drain()
    return serve


@pytest.mark.parametrize(
    ("head", "piece", "detail"),
    ids=["trailers", "chunk-extension", "trailer-value", "tiny-chunks"], argvalues=[
    # Trailers with new names, without end (newcomer's check: 2.1 GB of headers in 10 s).
    (CHUNKED_HEAD + b"2\r\n{}\r\n0\r\n", b"X-#: " + b"v" * 100 + b"\r\n",
     f"trailers longer than {HEAD_MAX_BYTES} bytes"),
    # One chunk extension without end: no body byte comes.
    (CHUNKED_HEAD + b"5;a=", b"b" * 1000, "without a body byte"),
    # One trailer value that never ends (no CRLF: never a whole trailer line).
    (CHUNKED_HEAD + b"2\r\n{}\r\n0\r\nX-Long: ", b"v" * 1000, "without a body byte"),
    # Framing between tiny chunks: each chunk's extension under the run's bound, and the
    # whole answer past the wire's (128 KiB + 8 x the cap).
    (CHUNKED_HEAD, b"1;" + b"e" * 200 + b"\r\n \r\n", "on the wire"),
])
async def test_framing_without_end_is_bounded(scraper: ExporterScraper, head: bytes,
                                              piece: bytes, detail: str) -> None:
    async with RawServer(_flood(head, piece)) as server:
        result = await scraper.scrape(_target(server.port))
    # Not a timeout: the bound ends it, whatever the exporter keeps sending.
    assert isinstance(result, Failure) and result.kind is FailureKind.HTTP_ERROR, result
    assert detail in result.detail
    assert scraper._pool.idle_count() == 0


async def test_trailers_are_not_headers_of_the_answer(scraper: ExporterScraper) -> None:
    body = b"%x\r\n%s\r\n0\r\nETag: \"t\"\r\nTrainjob-Exporter-Sequence: 7; start=abc\r\n\r\n" % (
        len(STATUS), STATUS)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD + body)
        await writer.drain()

    async with RawServer(serve) as server:
        result = await scraper.scrape(_target(server.port))
    assert isinstance(result, Fresh) and result.status.progress_percentage == 5
    assert result.etag is None and result.sequence is None


async def test_an_unsized_answer_cut_by_a_reset_is_not_complete(
        scraper: ExporterScraper) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n"
                     b"trainjob_last_update_timestamp_seconds 1764633600\n"
                     b"trainjob_progress_ratio 0.4")
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN: the body's end is unknown

    async with RawServer(serve) as server:
        result = await scraper.scrape(_target(server.port))
    assert isinstance(result, Failure) and result.kind is FailureKind.HTTP_ERROR, result
    assert "before a complete answer" in result.detail


async def test_a_head_past_its_bound_in_one_read_is_refused(scraper: ExporterScraper) -> None:
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + b"".join(b"X-%d: %s\r\n" % (i, b"v" * 100) for i in range(900))
            + b"Content-Length: %d\r\n\r\n" % len(STATUS))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(head + STATUS)  # about 98 KB: one read of the client's 256 KiB
        await writer.drain()

    async with RawServer(serve) as server:
        result = await scraper.scrape(_target(server.port))
    assert isinstance(result, Failure) and result.kind is FailureKind.HTTP_ERROR, result
    assert f"head longer than {HEAD_MAX_BYTES} bytes" in result.detail


async def test_a_body_in_one_byte_chunks_comes_whole(scraper: ExporterScraper) -> None:
    framed = b"".join(b"1\r\n%c\r\n" % byte for byte in STATUS) + b"0\r\n\r\n"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(CHUNKED_HEAD + framed)
        await writer.drain()

    async with RawServer(serve) as server:
        result = await scraper.scrape(_target(server.port))
    assert isinstance(result, Fresh) and result.status.progress_percentage == 5
