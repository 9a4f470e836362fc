"""A second machine on this one, for the tests that cut a network: a network namespace of the test's own, linked
to the root namespace by one veth pair, with an address on each end in a /30 no interface here uses.

Processes run in it with ``ip netns exec`` (``Host.runner``); they share the machine's files and process ids,
and reach the root namespace's services only at ``Host.peer``, the root end's address. ``cut`` takes the root
end's link down: inside, every packet out is lost in silence, as on a real partition (a statement waits
unanswered); the root namespace's connections to the network fail at once on a blackhole route (never the default
route, which would send them off the machine). ``heal`` brings the link back. Everything is removed at the end,
whatever happened.
"""

from __future__ import annotations

import ipaddress
import random
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


class NamespacesUnavailable(RuntimeError):
    """This machine cannot make network namespaces (not root, or no ``ip``)."""


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass(frozen=True)
class Host:
    name: str  # the namespace
    address: str  # the namespace end's address
    peer: str  # the root end's address: where the namespace reaches this machine's services
    network: str  # the /30 both ends are on
    link: str  # the root end's interface

    @property
    def runner(self) -> list[str]:
        """The command that runs the rest of a command line inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        _ip("link", "set", self.link, "down")

    def heal(self) -> None:
        _ip("link", "set", self.link, "up")


def _free_network() -> ipaddress.IPv4Network:
    """A /30 in 10.213.0.0/16 that no address or route of this machine overlaps."""
    used = subprocess.run(["ip", "-4", "-o", "route", "show", "table", "all"], capture_output=True, text=True).stdout
    used += subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    taken = []
    for word in used.split():
        try:
            taken.append(ipaddress.ip_network(word, strict=False))
        except ValueError:
            continue
    for _ in range(100):
        network = ipaddress.ip_network(f"10.213.{random.randrange(256)}.{4 * random.randrange(64)}/30")
        if not any(network.overlaps(t) for t in taken if t.prefixlen > 0):
            return network
    raise RuntimeError("no free /30 in 10.213.0.0/16")


@contextmanager
def namespace_host() -> Iterator[Host]:
    """A namespace with its link up; removed at the end (its processes must be stopped first)."""
    import os

    if os.geteuid() != 0 or shutil.which("ip") is None:
        raise NamespacesUnavailable("network namespaces need root and iproute2's ip")
    tag = secrets.token_hex(3)
    name, link, inner = f"tollfree-{tag}", f"tf{tag}r", f"tf{tag}n"
    network = _free_network()
    peer, address = (str(h) for h in network.hosts())
    _ip("netns", "add", name)
    try:
        _ip("link", "add", link, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", name)
        _ip("addr", "add", f"{peer}/30", "dev", link)
        _ip("link", "set", link, "up")
        # while the link is down its own route is gone: the network's packets are dropped here, never sent on by the
        # default route to wherever it leads
        _ip("route", "add", "blackhole", str(network), "metric", "4000")
        _ip("-n", name, "addr", "add", f"{address}/30", "dev", inner)
        _ip("-n", name, "link", "set", inner, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield Host(name, address, peer, str(network), link)
    finally:
        subprocess.run(["ip", "route", "del", "blackhole", str(network), "metric", "4000"], capture_output=True)
        subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)  # takes its peer with it
        subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
