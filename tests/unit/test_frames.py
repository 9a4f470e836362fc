"""The framed gateway-to-replica hop: frames cut anywhere reassemble, and the two ends over a real Unix socket
answer each call by id, refuse a connection without the token, and fail every waiting call when it closes."""

from __future__ import annotations

import asyncio
import os

import pytest
import uvloop

from serving.protocol import frames, wire
from serving.protocol.wire import ReplicaUnreachable
from serving.replica_server.frames_server import FrameListener
from serving.replicas.frames_client import connect


def _read_all(reader: frames.FrameReader, *chunks: bytes) -> list[frames.Frame]:
    """What a connection's owner does: feed each chunk, and read on after a hello (the reader stops there)."""
    got: list[frames.Frame] = []
    for chunk in chunks:
        received = reader.feed(chunk)
        got += received
        while received and received[-1].kind == frames.HELLO:
            received = reader.feed(b"")
            got += received
    return got


def test_frames_cut_at_every_byte_come_out_whole_and_in_order():
    stream = b"".join(
        [
            frames.frame(frames.HELLO, 0, b"token"),
            frames.frame(frames.CALL, 7, b"x" * 300),
            frames.frame(frames.ANSWER, 7, frames.answer_payload(1.5, b"envelope")),
            frames.frame(frames.CALL, 8, b""),
        ]
    )
    for cut in range(1, len(stream)):
        got = _read_all(frames.FrameReader(frames.MAX_CALL), stream[:cut], stream[cut:])
        assert [(f.kind, f.call_id, len(f.payload)) for f in got] == [(1, 0, 5), (2, 7, 300), (3, 7, 16), (2, 8, 0)]
    assert frames.split_answer(got[2].payload) == (1.5, b"envelope")


def test_a_stream_that_is_not_frames_is_refused_by_name_before_its_payload_is_read():
    with pytest.raises(frames.FrameError, match="unknown frame kind 9"):
        frames.FrameReader(frames.MAX_CALL).feed(frames.HEADER.pack(9, 1, 0))
    with pytest.raises(frames.FrameError, match="over the limit"):
        frames.FrameReader(frames.MAX_CALL).feed(frames.HEADER.pack(frames.CALL, 1, frames.MAX_CALL + 1))
    with pytest.raises(frames.FrameError, match="over the limit of 4096"):  # a replica, before the hello is checked
        frames.FrameReader(frames.MAX_HELLO).feed(frames.HEADER.pack(frames.HELLO, 0, 10_000))
    with pytest.raises(frames.FrameError, match="shorter than its busy clock"):
        frames.split_answer(b"abc")


def test_only_abstract_unix_names_are_frame_addresses():
    assert frames.unix_path("unix:@tollfree/replica/1/2") == "\0tollfree/replica/1/2"
    for bad in ("unix:/tmp/some.sock", "tcp:8080", "unix:@", "unix:@" + "n" * 107):
        with pytest.raises(frames.FrameError, match="unix:@NAME"):
            frames.unix_path(bad)


class _Busy:
    def total(self) -> float:
        return 2.25


class _Metrics:
    busy = _Busy()


class _App:
    """Answers each request with its own body, as a one-item answer envelope; several on a 'thread'."""

    metrics = _Metrics()

    def score_inline(self, envelope: bytes) -> bytes:
        requests = wire.decode_requests(envelope)
        return wire.encode_answers([wire.WireAnswer(200, 1, r.body, b"") for r in requests])

    async def score_threaded(self, envelope: bytes) -> bytes:
        await asyncio.sleep(0.05)  # answered after the lone calls sent behind it
        return self.score_inline(envelope)


def _envelope(*bodies: bytes) -> bytes:
    return wire.encode_requests([wire.WireRequest(str(i), "application/json", b) for i, b in enumerate(bodies)])


def test_calls_in_flight_on_one_connection_get_their_own_answers_and_a_closed_connection_fails_the_rest():
    address = f"unix:@tollfree-test/{os.getpid()}/{id(object())}"

    async def scenario() -> None:
        server = FrameListener(_App, "secret")
        await server.start(address)
        lost: list[bool] = []
        try:
            connection = await connect(address, "secret", 5.0, lambda c: lost.append(c))
            several, one, other = await asyncio.gather(
                connection.call(_envelope(b"[1]", b"[2]")),
                connection.call(_envelope(b"[3]")),
                connection.call(_envelope(b"[4]")),
            )
            assert [a.first for a in wire.decode_answers(several[1], 2)] == [b"[1]", b"[2]"]
            assert [wire.decode_answers(e[1], 1)[0].first for e in (one, other)] == [b"[3]", b"[4]"]
            assert several[0] == one[0] == 2.25
            with pytest.raises(ReplicaUnreachable, match="shorter than its header"):
                await connection.call(b'{"items":[["a","application/json",10]]}\n{}')
            assert connection.open, "a malformed envelope fails its call, not the connection"

            waiting = asyncio.ensure_future(connection.call(_envelope(b"[5]", b"[6]")))
            await asyncio.sleep(0.01)
            connection.close()
            with pytest.raises(ReplicaUnreachable, match="closed"):
                await waiting
            deadline = asyncio.get_running_loop().time() + 5
            while not lost:
                assert asyncio.get_running_loop().time() < deadline, "on_lost was never called"
                await asyncio.sleep(0.01)

            stranger = await connect(address, "wrong", 5.0, lambda c: None)
            with pytest.raises(ReplicaUnreachable, match="token must come first"):
                await stranger.call(_envelope(b"[7]"))
            assert not stranger.open
        finally:
            await server.close(grace_s=5)

    uvloop.run(scenario())  # the gateway's and the replica's loop


def test_a_replica_without_a_scoring_model_fails_the_call_and_keeps_the_connection():
    address = f"unix:@tollfree-test/{os.getpid()}/{id(object())}"

    async def scenario() -> None:
        server = FrameListener(lambda: None, None)  # a standby: nothing loaded yet
        await server.start(address)
        try:
            connection = await connect(address, None, 5.0, lambda c: None)
            with pytest.raises(ReplicaUnreachable, match="no scoring model"):
                await connection.call(_envelope(b"[1]"))
            assert connection.open
            connection.close()
        finally:
            await server.close(grace_s=5)

    uvloop.run(scenario())  # the gateway's and the replica's loop


def test_the_client_posts_the_first_envelope_then_frames_and_falls_back_to_http_when_the_socket_goes():
    """A replica's HTTP answer names its frame socket; later envelopes go there. A socket that goes away sends
    the next envelope over HTTP (which names it again); one that cannot be reached is not tried again."""
    from aiohttp import web

    from serving.replicas.client import ReplicaClient

    address = f"unix:@tollfree-test/{os.getpid()}/{id(object())}"
    advertised = [address]
    posts: list[str] = []

    async def batch(request: web.Request) -> web.Response:
        assert request.headers["authorization"] == "Bearer secret"
        posts.append(request.path)
        return web.Response(
            body=_App().score_inline(await request.read()),
            headers={wire.BUSY_HEADER: "1.0", frames.ADDRESS_HEADER: advertised[0]},
        )

    async def scenario() -> None:
        app = web.Application()
        app.router.add_post(wire.PATH, batch)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        replica = type("Replica", (), {"url": f"http://127.0.0.1:{port}"})()
        server = FrameListener(_App, "secret")
        await server.start(address)
        client = ReplicaClient("secret")
        await client.start()
        requests = [wire.WireRequest("r", "application/json", b"[42]")]

        async def send() -> tuple[bytes, float | None]:
            reply = await client.send(replica, requests)
            return reply.answers[0].first, reply.busy_s

        try:
            assert await send() == (b"[42]", 1.0) and len(posts) == 1, "the first envelope goes over HTTP"
            assert await send() == (b"[42]", 2.25) and len(posts) == 1, "the next ones in frames"
            assert await send() == (b"[42]", 2.25) and len(posts) == 1
            client._connections[replica.url].close()  # the link is cut (as when the replica's process ends)
            deadline = asyncio.get_running_loop().time() + 5
            while client._connections:
                assert asyncio.get_running_loop().time() < deadline, "the cut connection was never noticed"
                await asyncio.sleep(0.01)
            assert await send() == (b"[42]", 1.0) and len(posts) == 2, "after a cut, HTTP once"
            assert await send() == (b"[42]", 2.25) and len(posts) == 2, "then frames again"

            advertised[0] = "unix:@tollfree-test/nobody-listens-here"
            other = type("Replica", (), {"url": f"http://localhost:{port}"})()
            for _ in range(3):
                reply = await client.send(other, requests)
                assert reply.answers[0].first == b"[42]"
            assert len(posts) == 5, "a socket that cannot be reached: HTTP every time"
            assert client._unreachable == {"unix:@tollfree-test/nobody-listens-here"}
        finally:
            await client.close()
            await server.close(grace_s=5)
            await runner.cleanup()

    uvloop.run(scenario())


def test_a_closing_replica_answers_the_calls_in_flight_refuses_new_ones_and_then_closes():
    address = f"unix:@tollfree-test/{os.getpid()}/{id(object())}"

    async def scenario() -> None:
        server = FrameListener(_App, None)
        await server.start(address)
        lost: list[object] = []
        connection = await connect(address, None, 5.0, lambda c: lost.append(c))
        waiting = asyncio.ensure_future(connection.call(_envelope(b"[1]", b"[2]")))  # on the 'thread': 50 ms
        deadline = asyncio.get_running_loop().time() + 5
        while not [t for c in server._connections for t in c.in_flight]:
            assert asyncio.get_running_loop().time() < deadline, "the call never reached the replica"
            await asyncio.sleep(0.001)
        closing = asyncio.ensure_future(server.close(grace_s=5))
        await asyncio.sleep(0)  # the listener stops: new calls are refused from here on
        with pytest.raises(ReplicaUnreachable, match="stopping"):
            await connection.call(_envelope(b"[3]"))
        await closing
        assert waiting.done(), "close() returned only after the call in flight was answered"
        _busy, envelope = waiting.result()
        assert [a.first for a in wire.decode_answers(envelope, 2)] == [b"[1]", b"[2]"]
        while not lost:
            assert asyncio.get_running_loop().time() < deadline, "the replica never closed the connection"
            await asyncio.sleep(0.001)
        with pytest.raises(OSError):
            await connect(address, None, 1.0, lambda c: None)

    uvloop.run(scenario())
