"""``python -m infra.stack status``: each service of the recorded stack, running and answering or not, the
processes they started, the Prefect deployments, and the gateway's endpoints with their streams' lag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import httpx

from infra.processes import marked
from infra.services import child_environ, services
from infra.stack_config import StackConfig
from infra.stack_record import StackRecord


def status(config: StackConfig, environ: Mapping[str, str]) -> int:
    record = StackRecord.load(config.record_path)
    if record is None:
        print(f"tollfree is not running (no stack recorded in {config.record_path}); start it with make up")
        return 3
    token = environ.get("TOLLFREE_TOKEN") or (
        config.token_file.read_text().strip() if config.token_file.exists() else ""
    )
    config = dataclasses.replace(config, gateways=record.gateways)  # what runs, whatever this shell says
    env = child_environ(config, environ, record.stack_id, token)
    ok = True
    rows = []
    with httpx.Client(timeout=3.0) as client:
        for service in services(config, env):
            proc = record.services.get(service.name)
            if proc is None or not proc.alive():
                ok = False
                rows.append((service.name, "-", "stopped", service.url or ""))
                continue
            healthy = service.healthy(client)
            ok &= healthy
            rows.append(
                (service.name, str(proc.pid), "running" if healthy else "running, not answering", service.url or "")
            )
        print(f"tollfree stack in {config.home}:")
        for name, pid, state, url in rows:
            print(f"  {name:<15} pid {pid:<8} {state:<24} {url}")
        extra = marked(record.stack_id)
        known = {p.pid for p in record.services.values()}
        spawned = len([p for p, _ in extra if p not in known])
        print(f"  + {spawned} process(es) started by them (replicas, flow runs, helpers)")
        for line in _deployment_lines(config, client):
            print(line)
        for line in _endpoint_lines(config, client, token):
            print(line)
    return 0 if ok else 3


def _stream_lines(endpoint: dict) -> list[str]:
    """An endpoint's stream inputs with their consumer group's lag, read from their Redis server."""
    import redis

    from serving.streams.config import StreamAddress

    lines = []
    for stream in endpoint.get("config", {}).get("stream_inputs", []):
        source = StreamAddress.parse(stream["source"], "source")
        try:
            with redis.Redis(host=source.host, port=source.port, socket_timeout=3) as client:
                group = next(
                    (g for g in client.xinfo_groups(source.stream) if g["name"].decode() == stream["group"]), None
                )
            lag = (
                "no consumer group yet"
                if group is None
                else f"lag {int(group.get('lag') or 0) + int(group['pending'])} entries ({group['pending']} in flight)"
            )
        except redis.RedisError as exc:
            lag = f"broker not answering ({type(exc).__name__})"
        lines.append(
            f"      stream {source.url} -> {stream['sink'].rsplit('/', 1)[-1]}  group {stream['group']}: {lag}"
        )
    return lines


def _deployment_lines(config: StackConfig, client: httpx.Client) -> list[str]:
    try:
        flows = {f["id"]: f["name"] for f in client.post(f"{config.prefect_api}/flows/filter", json={}).json()}
        found = client.post(f"{config.prefect_api}/deployments/filter", json={}).json()
    except (httpx.HTTPError, ValueError):
        return ["  deployments: Prefect API not answering"]
    lines = [f"  deployments ({len(found)}):"]
    for d in sorted(found, key=lambda d: (flows.get(d["flow_id"], ""), d["name"])):
        crons = [s["schedule"].get("cron") or s["schedule"].get("interval") for s in d.get("schedules", [])]
        when = ", ".join(str(c) for c in crons) if crons else "on trigger / on demand"
        paused = " (paused)" if d.get("paused") else ""
        name = f"{flows.get(d['flow_id'], '?')}/{d['name']}"
        lines.append(f"    {name:<28} {when:<24}{paused}  pool {d.get('work_pool_name')}")
    return lines


def _endpoint_lines(config: StackConfig, client: httpx.Client, token: str) -> list[str]:
    try:
        answer = client.get(
            f"{config.url('gateway')}/api/2.0/serving-endpoints", headers={"Authorization": f"Bearer {token}"}
        )
        endpoints = answer.json().get("endpoints", []) if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        endpoints = None
    if endpoints is None:
        return ["  endpoints: gateway not answering"]
    lines = [f"  endpoints ({len(endpoints)}):"]
    for e in endpoints:
        state = e.get("state", {})
        lines.append(f"    {e['name']:<16} {state.get('ready')} / {state.get('config_update')}")
        lines.extend(_stream_lines(e))
    return lines
