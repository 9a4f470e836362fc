"""HAProxy in front of several gateways (``make up`` with ``TOLLFREE_GATEWAYS`` >= 2): its configuration. Pure.

What it does for a client:
- health checks: ``GET /healthz`` on each gateway every second; one failed check takes a gateway out, one
  passed check brings it back;
- retries: a request whose connection fails, or that gets an empty or broken answer (a gateway killed while
  it held the request), is sent again, to another gateway (``option redispatch 1``), up to 3 times. HAProxy
  can retry only a request it holds whole: it waits for the whole body before it sends a request on
  (``option http-buffer-request``), and bodies over ``BUFFER_BYTES`` are not retried. Predictions are idempotent,
  so a request sent twice is answered once; a request the dead gateway had already logged is logged twice;
- ``balance leastconn``: each new request to the gateway with the fewest in flight;
- another region's gateways as backup servers (``backups``, for clients that cannot fail over themselves): they
  take requests only while every gateway of this region fails its health check (all of them then, ``option
  allbackups``); a retried request goes there too once this region's are all down.
"""

from __future__ import annotations

from collections.abc import Sequence

BUFFER_BYTES = 262_144  # tune.bufsize: the largest request HAProxy can retry whole


def config(
    listen_port: int, gateway_ports: Sequence[int | str], host: str = "127.0.0.1", backups: Sequence[str] = ()
) -> str:
    """HAProxy's configuration: listening on ``host:listen_port``, balancing over the gateways, each a port on
    ``host`` or an address of its own (``"10.0.0.2:8080"``); ``backups``: another region's gateways
    (addresses), used only while none of these is up."""
    addresses = [g if isinstance(g, str) else f"{host}:{g}" for g in gateway_ports]
    servers = "\n".join(f"    server gateway-{i} {a} check" for i, a in enumerate(addresses, 1))
    if backups:
        servers += "\n    option allbackups\n" + "\n".join(
            f"    server backup-{i} {a} check backup" for i, a in enumerate(backups, 1)
        )
    return f"""# written by make up (infra/haproxy.py); rewritten at every up
global
    maxconn 4096
    tune.bufsize {BUFFER_BYTES}

defaults
    mode http
    option httplog
    log stdout format raw local0
    timeout connect 2s
    timeout client 130s
    timeout server 130s
    timeout http-request 30s
    retries 3
    option redispatch 1
    retry-on conn-failure empty-response junk-response
    option http-buffer-request

frontend gateways
    bind {host}:{listen_port}
    default_backend gateways

backend gateways
    balance leastconn
    option httpchk GET /healthz
    http-check expect status 200
    default-server inter 1s fall 1 rise 1
{servers}
"""


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m infra.haproxy --listen PORT --gateway ADDR [--gateway ADDR ...] [--backup ADDR ...]``: the
    configuration on stdout, for a load balancer in front of a region with another region's gateways as backups."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m infra.haproxy", description=main.__doc__)
    parser.add_argument("--listen", type=int, required=True, help="the port HAProxy listens on")
    parser.add_argument("--host", default="127.0.0.1", help="the address HAProxy listens on")
    parser.add_argument("--gateway", action="append", required=True, help="a gateway of this region, host:port")
    parser.add_argument("--backup", action="append", default=[], help="a gateway of another region, host:port")
    args = parser.parse_args(argv)
    for address in [*args.gateway, *args.backup]:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            parser.error(f"{address!r} is not host:port")
    print(config(args.listen, list(args.gateway), args.host, args.backup), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
