"""The shadow mirror: which requests a shadow is sent, that nothing it does reaches the caller, how a copy is
logged, and the bound on copies in flight."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from serving.endpoints.live import LiveEndpoint
from serving.gateway.data_plane import Reply
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.shadow import ShadowMirror
from serving.inference_log import InferenceLogWriter, read_inference_log
from serving.protocol.errors import ApiError
from serving.protocol.wire import WireAnswer, WireRequest


def _answer(body: bytes) -> WireAnswer:
    return WireAnswer(200, 1, body, b"")


class FakeScore:
    """The data plane's score_on_entity: answers ``[1]``, raises for ``fail`` or waits on ``gate``."""

    def __init__(self, fail: BaseException | None = None, gate: asyncio.Event | None = None) -> None:
        self.fail, self.gate, self.calls = fail, gate, []

    async def __call__(self, live, name, entity, request, reply) -> None:  # type: ignore[no-untyped-def]
        self.calls.append((name, entity, request.request_id))
        reply.served_entity, reply.version = entity, "2"
        if self.gate is not None:
            await self.gate.wait()
        if self.fail is not None:
            raise self.fail
        reply.answered(_answer(b"[1]"))


def _mirror(score: FakeScore, folder: Path, share: int = 100, **kw: int) -> tuple[ShadowMirror, LiveEndpoint]:
    mirror = ShadowMirror(score, Reply, InferenceLogWriter(folder), GatewayMetrics.create(), random.Random(3), **kw)
    live = LiveEndpoint({"b": Shadow()}, [("a", 100), ("b", 0)], shadows=(("b", share),))  # type: ignore[dict-item]
    return mirror, live


class Shadow:
    """The shadow's replica set as the mirror reads it: its dispatcher's queue."""

    def __init__(self, waiting: int = 0, ready: bool = True) -> None:
        self.dispatcher = SimpleNamespace(waiting=waiting, queue_limit=10) if ready else None


def _request(i: int) -> WireRequest:
    return WireRequest(f"r-{i}", "application/json", b'{"dataframe_split": {"columns": ["x"], "data": [[1]]}}')


@pytest.mark.parametrize(
    ("fail", "status"),
    [(None, 200), (ApiError(429, "REQUEST_LIMIT_EXCEEDED", "full"), 429), (RuntimeError("boom"), 500)],
)
def test_every_copy_is_logged_as_shadow_under_the_clients_request_id(tmp_path, fail, status) -> None:  # type: ignore[no-untyped-def]
    async def run() -> None:
        mirror, live = _mirror(FakeScore(fail), tmp_path)
        mirror.mirror(live, "ep", _request(1), "a")  # returns at once: the copy is a task
        await asyncio.gather(*mirror._tasks)
        mirror.inference_log.close()

    asyncio.run(run())
    (record,) = read_inference_log(tmp_path, shadow=True).to_dict("records")
    assert (record["request_id"], record["served_entity"], record["status_code"]) == ("r-1", "b", status)
    assert record["outputs"] == ("[1]" if status == 200 else None) and record["inputs"] is None
    assert read_inference_log(tmp_path).empty  # not a client's record


def test_a_share_copies_about_that_share_and_never_to_the_entity_that_answered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def run() -> FakeScore:
        score = FakeScore()
        mirror, live = _mirror(score, tmp_path, share=25)
        for i in range(400):
            mirror.mirror(live, "ep", _request(i), "a")
        mirror.mirror(live, "ep", _request(999), "b")  # a request the shadow itself answered (a pinned version)
        await asyncio.gather(*mirror._tasks)
        mirror.inference_log.close()
        return score

    score = asyncio.run(run())
    assert 70 <= len(score.calls) <= 130 and ("ep", "b", "r-999") not in score.calls


def test_copies_past_the_bound_are_skipped_and_counted(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async def run() -> tuple[int, float]:
        gate = asyncio.Event()
        mirror, live = _mirror(FakeScore(gate=gate), tmp_path, max_in_flight=5)
        for i in range(8):
            mirror.mirror(live, "ep", _request(i), "a")
        in_flight = mirror.in_flight
        gate.set()
        await asyncio.gather(*mirror._tasks)
        mirror.inference_log.close()
        return in_flight, mirror.metrics.shadow_skipped.labels("ep", "in_flight")._value.get()

    assert asyncio.run(run()) == (5, 3.0)


@pytest.mark.parametrize(("shadow", "reason"), [(Shadow(waiting=10), "busy"), (Shadow(ready=False), "not_ready")])
def test_no_copy_goes_to_a_shadow_that_could_not_take_it(tmp_path, shadow, reason) -> None:  # type: ignore[no-untyped-def]
    async def run() -> float:
        score = FakeScore()
        mirror, live = _mirror(score, tmp_path)
        live.replica_sets["b"] = shadow
        mirror.mirror(live, "ep", _request(1), "a")
        assert mirror.in_flight == 0 and not score.calls
        mirror.inference_log.close()
        return mirror.metrics.shadow_skipped.labels("ep", reason)._value.get()

    assert asyncio.run(run()) == 1.0
