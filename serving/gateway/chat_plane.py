"""The data plane for chat requests: ``POST /serving-endpoints/{name}/invocations`` with ``messages``, and
the OpenAI-compatible ``POST /serving-endpoints/chat/completions`` (``model`` = the endpoint's name).

A request is checked (``serving.generative.chat``), passes the endpoint's AI gateway (input PII guardrail,
call and token budgets: ``serving.generative``), is answered from the exact-match cache when its
temperature is 0 and the endpoint has one, and otherwise goes to the served entity the traffic split picks:
a replica of a chat model or an external model's server. With fallbacks on, a served entity that cannot
take it (unreachable, 5xx, 429, silent) hands it to the next one in the traffic config's order, as long as
nothing has been sent to the client yet.

A stream is relayed event by event as each completes: never held back for the next one. It holds its
replica's slot until its last token (the replica's ``outstanding`` and the entity's load meter count it,
so streams in flight are the autoscaler's load signal), and a client that goes away closes the upstream
connection, which cancels the generation. An upstream that fails mid-stream ends the stream with an error
event. Every request leaves one inference-log record with its token usage.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import orjson

from serving.endpoints.live import LiveEndpoint
from serving.endpoints.manager import EndpointManager
from serving.gateway.auth import Principal
from serving.gateway.chat_relay import Outcome, guard_input, guard_output, relay_stream, send_json
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.upstream import Target, UpstreamFailed, UpstreamRefused, Upstreams, read_whole
from serving.generative.ai_gateway import AiGatewayConfig
from serving.generative.budget import UsageBudgets
from serving.generative.chat import ChatRequest, completion_text, estimate_tokens, parse_chat_request, usage_of
from serving.generative.redact import redact
from serving.inference_log import InferenceLogWriter, InferenceRecord, utc_now
from serving.protocol.errors import ApiError, error_body, invalid_parameter, unavailable
from serving.replicas.replica_set import ReplicaSet
from serving.traffic.replica import Replica
from serving.traffic.router import choose_entity, pick_replica

log = logging.getLogger(__name__)

OPENAI_ROUTE = "/serving-endpoints/chat/completions"
DEFAULT_COMPLETION_BUDGET = 256  # tokens a request without max_tokens is charged up front (settled after)
NO_AI_GATEWAY = AiGatewayConfig()


@dataclass
class _Attempt:
    target: Target
    response: Any
    replica: Replica | None  # a local replica's slot, held until the answer ends
    replica_set: ReplicaSet | None  # the replica's set (for the load meter)
    version: str | None


class ChatPlane:
    def __init__(
        self,
        manager: EndpointManager,
        inference_log: InferenceLogWriter,
        metrics: GatewayMetrics,
        *,
        budgets: UsageBudgets | None = None,
        upstreams: Upstreams | None = None,
        rng: random.Random | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.manager = manager
        self.inference_log = inference_log
        self.metrics = metrics
        self.budgets = budgets or UsageBudgets()
        self.upstreams = upstreams or Upstreams(idle_timeout_s=timeout_s)
        self.rng = rng or random.Random()
        self.timeout_s = timeout_s

    async def handle(
        self,
        receive: Any,
        send: Any,
        name: str,
        who: Principal,
        data: dict[str, Any],
        request_id: str,
        started: float,
        *,
        openai: bool = False,
    ) -> None:
        outcome = Outcome(started)
        request: ChatRequest | None = None
        ai = NO_AI_GATEWAY
        try:
            request = parse_chat_request(data, require_model=openai)
            ai = self.manager.ai_gateways.get(name) or NO_AI_GATEWAY
            request = guard_input(request, ai)
            if request.stream and ai.output_pii != "NONE":
                raise invalid_parameter(
                    "stream: this endpoint's output guardrail checks whole answers; send stream: false"
                )
            live = self.manager.live.get(name) or await self.manager.served(name)
            await self._serve(receive, send, name, who, live, request, ai, request_id, outcome)
        except ApiError as err:
            outcome.status, outcome.error_code = err.status_code, err.error_code
            if not outcome.started_response:
                await send_json(send, err.status_code, orjson.dumps(error_body(err)), request_id, err.headers)
        finally:
            self._record(name, request, ai, request_id, outcome)

    async def _serve(
        self,
        receive: Any,
        send: Any,
        name: str,
        who: Principal,
        live: LiveEndpoint,
        request: ChatRequest,
        ai: AiGatewayConfig,
        request_id: str,
        outcome: Outcome,
    ) -> None:
        charge = request.prompt_tokens() + (request.max_tokens or DEFAULT_COMPLETION_BUDGET)
        reservation = self.budgets.reserve(name, who.name, ai.rate_limits, charge)
        try:
            cache = live.cache if not request.stream else None
            body_key = request.cache_key() if cache is not None else None
            key = ("chat", body_key.decode()) if body_key is not None else None  # the body is JSON: UTF-8
            hit = cache.get(key) if cache is not None and key is not None else None
            if hit is not None:
                outcome.entity, outcome.version, body = hit
                outcome.cached = True
                self._observe_whole(outcome, body, request)
                outcome.prompt_tokens = outcome.completion_tokens = 0  # the model was not asked
                await send_json(
                    send, 200, body, request_id, {"served-model-name": outcome.entity, "x-tollfree-cache": "hit"}
                )
                return
            attempt = await self._open(name, live, request, ai, request_id, outcome)
            try:
                if request.stream:
                    await relay_stream(
                        receive,
                        send,
                        attempt.response,
                        attempt.target,
                        request,
                        request_id,
                        outcome,
                        self.metrics,
                        name,
                    )
                else:
                    body = await read_whole(attempt.target, attempt.response)
                    body = guard_output(body, ai)
                    self._observe_whole(outcome, body, request)
                    if cache is not None and key is not None:
                        cache.put(key, (outcome.entity, outcome.version, body))
                    await send_json(send, 200, body, request_id, {"served-model-name": str(outcome.entity)})
            except UpstreamFailed as failed:
                raise failed.to_api_error(self.timeout_s) from None
            finally:
                attempt.response.close()
                self._release(attempt, outcome)
        finally:
            self.budgets.settle(reservation, outcome.prompt_tokens + outcome.completion_tokens)

    async def _open(
        self,
        name: str,
        live: LiveEndpoint,
        request: ChatRequest,
        ai: AiGatewayConfig,
        request_id: str,
        outcome: Outcome,
    ) -> _Attempt:
        """The first served entity (in fallback order) that takes the request."""
        order = attempt_order(live.weights, choose_entity(live.weights, self.rng), ai.fallbacks)
        failure: UpstreamFailed | None = None
        for entity_name in order:
            attempt = await self._target(live, entity_name, request_id)
            outcome.entity, outcome.version = entity_name, attempt.version
            body = request.upstream_body(_upstream_model(live, entity_name), stream=request.stream)
            try:
                attempt.response = await self.upstreams.open_chat(attempt.target, body)
                return attempt
            except UpstreamFailed as exc:
                self._release(attempt, outcome)
                failure = exc
                log.warning(
                    "endpoint %s: served entity %s failed (%s)%s",
                    name,
                    entity_name,
                    exc.reason,
                    "; trying the next one" if entity_name != order[-1] else "",
                )
                if entity_name != order[-1]:
                    self.metrics.fallbacks.labels(name, entity_name).inc()
            except UpstreamRefused as refused:
                self._release(attempt, outcome)
                if attempt.target.external:
                    raise ApiError(
                        400 if refused.status < 500 else 502,
                        "BAD_REQUEST",
                        f"served entity {entity_name}: the upstream refused the request (HTTP {refused.status})",
                    ) from None
                raise _replica_error(refused) from None
        assert failure is not None
        raise failure.to_api_error(self.timeout_s)

    async def _target(self, live: LiveEndpoint, entity_name: str, request_id: str) -> _Attempt:
        external = live.external.get(entity_name)
        if external is not None:
            try:
                key = self.manager.secrets.read(str(external.openai_config.openai_api_key))
            except LookupError:
                raise unavailable(f"served entity {entity_name}: its API key secret is not set") from None
            headers = {"authorization": f"Bearer {key}"}
            if external.openai_config.openai_organization:
                headers["openai-organization"] = external.openai_config.openai_organization
            return _Attempt(
                Target(entity_name, external.base_url + "/chat/completions", headers, True),
                None,
                None,
                None,
                external.name,
            )
        replica_set = live.replica_sets[entity_name]
        replica = await self._replica(replica_set)
        replica.outstanding += 1
        if replica_set.dispatcher is not None:
            now = time.monotonic()
            replica_set.dispatcher.meter.arrived(now)
            replica_set.dispatcher.meter.started(now)  # a chat replica answers its requests side by side
        headers = {"x-request-id": request_id}
        if self.manager.launcher.token:
            headers["authorization"] = f"Bearer {self.manager.launcher.token}"
        return _Attempt(
            Target(entity_name, replica.url + "/invocations", headers, False),
            None,
            replica,
            replica_set,
            replica_set.version,
        )

    async def _replica(self, replica_set: ReplicaSet) -> Replica:
        """The replica set's replica with the fewest answers in progress; from zero, the first that starts."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            replica = pick_replica([r for r in replica_set.replicas if r.alive()], replica_set.max_concurrency)
            if replica is not None:
                return replica
            if (
                replica_set.dispatcher is not None
                and replica_set.dispatcher.on_starved is not None
                and not replica_set.replicas
            ):
                replica_set.dispatcher.on_starved()
            if time.monotonic() > deadline:
                raise ApiError(
                    429,
                    "REQUEST_LIMIT_EXCEEDED",
                    f"served entity {replica_set.name} has no free slot; retry shortly",
                    {"Retry-After": "1"},
                )
            await asyncio.sleep(0.05)  # a replica starting or a slot freeing: polled until the deadline

    def _release(self, attempt: _Attempt, outcome: Outcome) -> None:
        if attempt.replica is None:
            return
        attempt.replica.outstanding -= 1
        attempt.replica = None
        if attempt.replica_set is not None and attempt.replica_set.dispatcher is not None:
            ok, now = outcome.status == 200, time.monotonic()
            attempt.replica_set.dispatcher.meter.stopped(now)
            attempt.replica_set.dispatcher.meter.finished(now, time.perf_counter() - outcome.started if ok else None)

    def _observe_whole(self, outcome: Outcome, body: bytes, request: ChatRequest) -> None:
        try:
            answer = orjson.loads(body)
        except orjson.JSONDecodeError:
            answer = {}
        text = completion_text(answer) if isinstance(answer, dict) else ""
        reported = usage_of(answer) if isinstance(answer, dict) else None
        outcome.prompt_tokens, outcome.completion_tokens = reported or (request.prompt_tokens(), estimate_tokens(text))
        outcome.text.append(text)

    def _record(
        self, name: str, request: ChatRequest | None, ai: AiGatewayConfig, request_id: str, outcome: Outcome
    ) -> None:
        elapsed = time.perf_counter() - outcome.started
        entity = outcome.entity or ""
        self.metrics.requests.labels(name, entity, str(outcome.status)).inc()
        self.metrics.latency.labels(name, entity).observe(elapsed)
        if outcome.status == 200 and not outcome.cached:
            self.metrics.tokens.labels(name, entity, "input").inc(outcome.prompt_tokens)
            self.metrics.tokens.labels(name, entity, "output").inc(outcome.completion_tokens)
        inputs = orjson.dumps(list(request.messages)).decode() if request is not None else None
        outputs = "".join(outcome.text) if outcome.status == 200 else None
        if ai.redact:
            inputs = redact(inputs, ai.redact) if inputs else inputs
            outputs = redact(outputs, ai.redact) if outputs else outputs
        self.inference_log.record(
            InferenceRecord(
                request_id=request_id,
                timestamp=utc_now(),
                endpoint=name,
                served_entity=outcome.entity,
                model_version=outcome.version,
                status_code=outcome.status,
                latency_ms=elapsed * 1000,
                inputs=inputs,
                served_features=None,
                outputs=outputs,
                error_code=outcome.error_code,
                rows=1 if outcome.status == 200 else 0,
                input_tokens=outcome.prompt_tokens if outcome.status == 200 else None,
                output_tokens=outcome.completion_tokens if outcome.status == 200 else None,
            )
        )


def attempt_order(weights: list[tuple[str, int]], first: str, fallbacks: bool) -> list[str]:
    """``first``, then (with fallbacks on) every other served entity in the traffic config's order."""
    if not fallbacks:
        return [first]
    return [first, *(n for n, _ in weights if n != first)]


def _upstream_model(live: LiveEndpoint, entity_name: str) -> str:
    external = live.external.get(entity_name)
    return external.name if external is not None else entity_name


def _replica_error(refused: UpstreamRefused) -> ApiError:
    """A replica's own 4xx: its body is ours (a Databricks error naming the field), passed on as it is."""
    try:
        body = orjson.loads(refused.body)
        return ApiError(refused.status, str(body.get("error_code", "BAD_REQUEST")), str(body.get("message", ""))[:1000])
    except (orjson.JSONDecodeError, AttributeError):
        return ApiError(refused.status, "BAD_REQUEST", f"the replica refused the request (HTTP {refused.status})")
