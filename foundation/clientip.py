"""The client's address, as every rate limit, lockout and audit event must see it.

Behind a load balancer REMOTE_ADDR is the proxy's address and the client's is in
X-Forwarded-For, a header anyone can send. It is believed only when the connection comes from a
proxy listed in `TRUSTED_PROXIES` (addresses or CIDR networks): the header is read from the
right, skipping trusted proxies, and the first address that is not one is the client. Anything
else (no trusted proxy, a malformed entry) leaves the peer's own address.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from functools import cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

PEER_ADDR = "PORTAL_PEER_ADDR"  # request.META key keeping the connection's own address


def parse_networks(entries: Iterable[str]) -> tuple[Network, ...]:
    """'10.0.0.0/8', '127.0.0.1' -> networks; a bad entry is a configuration error, said early."""
    networks = []
    for entry in entries:
        entry = entry.strip()
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise ValueError(f"TRUSTED_PROXIES: '{entry}' is not an address or network") from exc
    return tuple(networks)


@cache
def _trusted(entries: tuple[str, ...]) -> tuple[Network, ...]:
    return parse_networks(entries)


def _is_trusted(addr: str, trusted: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return False
    return any(ip in net for net in trusted)


def resolve_client_addr(
    remote_addr: str, forwarded_for: str | None, trusted: tuple[Network, ...]
) -> str:
    """The client's address from the peer's and its X-Forwarded-For, believing trusted proxies."""
    if not trusted or not forwarded_for or not _is_trusted(remote_addr, trusted):
        return remote_addr
    client = remote_addr
    for entry in reversed(forwarded_for.split(",")):
        entry = entry.strip()
        try:
            ipaddress.ip_address(entry)
        except ValueError:
            return client  # a malformed hop: believe nothing to its left
        client = entry
        if not _is_trusted(entry, trusted):
            return entry
    return client


def trusted_proxies() -> tuple[Network, ...]:
    return _trusted(tuple(getattr(settings, "TRUSTED_PROXIES", ())))


class ClientAddressMiddleware:
    """Sets REMOTE_ADDR to the resolved client address, before anything reads it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        trusted_proxies()  # a bad setting fails at start-up, not on the first request

    def __call__(self, request: HttpRequest) -> HttpResponse:
        peer = request.META.get("REMOTE_ADDR") or ""
        request.META[PEER_ADDR] = peer
        request.META["REMOTE_ADDR"] = resolve_client_addr(
            peer, request.META.get("HTTP_X_FORWARDED_FOR"), trusted_proxies()
        )
        return self.get_response(request)
