"""Which addresses spillway fetches from or posts to on a client's say-so (docs/design.md,
"Clients, inputs and outputs"): an input image's URL and a job's own callback URL. A client must
not make a worker or an agent reach what only they can reach (a cloud's metadata service, the
studio's internal hosts, ComfyUI itself), so such a URL must be http(s) and every address its
host resolves to must be global, unless the host is listed in SPILLWAY_INPUT_ALLOW_HOSTS (the
studio's own file server). Checked at submit and again right before each request, redirects
included: a name can resolve differently later.

The check reads the URL as httpx does and resolves the very name httpx would connect to: its
IDNA 2008 form (straße is xn--strae-oqa), not the IDNA 2003 one (strasse) that Python's socket
module makes of a name passed as text, which may be another host. It resolves once and returns
what it checked; activities/pinned.py connects to those addresses and nowhere else, so an answer
that changes after the check (DNS rebinding) is never used.

A refusal names the host and the setting, never which ports answer: the same rule says no
before any connection is made.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from dataclasses import dataclass

import httpx


class Refused(Exception):
    """The URL is not one spillway may reach (its message says why, without the URL's path,
    query or user-info)."""


@dataclass(frozen=True)
class Checked:
    """A URL that passed: its host as httpx sends it (lower case, IDNA 2008, an IPv6 literal
    without brackets), its port, and the addresses the host resolved to, every one checked;
    `addresses` is empty for a listed host, which is not resolved here."""

    host: str
    port: int
    addresses: tuple[str, ...]


def allow_list(text: str) -> frozenset[str]:
    """SPILLWAY_INPUT_ALLOW_HOSTS: host names or IP literals, comma-separated; kept in the form
    `check` compares, so a listed straße.lan is the xn--strae-oqa.lan that httpx reaches."""
    return frozenset(_wire_host(h.strip()) for h in text.split(",") if h.strip())


def _wire_host(host: str) -> str:
    try:
        return httpx.URL(scheme="http", host=host).raw_host.decode("ascii")
    except httpx.InvalidURL:  # matches no URL's host
        return host.lower()


# IPv6 forms that carry an IPv4 address a translator or tunnel delivers to: NAT64 (RFC 6052,
# and the local-use prefix of RFC 8215) and IPv4-compatible addresses (deprecated, ::/96).
# Python's is_global calls them global whatever IPv4 address they carry.
NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def _carried_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address reaches in the end: mapped, 6to4, Teredo (its client),
    NAT64 or IPv4-compatible; None for a plain IPv6 address."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip.teredo is not None:
        return ip.teredo[1]
    if any(ip in net for net in NAT64) or (ip in IPV4_COMPATIBLE and int(ip) > 1):
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _global(address: str) -> bool:
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        ip = _carried_ipv4(ip) or ip
    return ip.is_global and not ip.is_multicast


def _refused(host: str) -> Refused:
    return Refused(
        f"refused: {host} is not allowed (it is or resolves to a loopback, private, link-local "
        "or otherwise internal address; list it in SPILLWAY_INPUT_ALLOW_HOSTS if it is the "
        "studio's own server)"
    )


async def resolve(host: str, port: int) -> tuple[str, ...]:
    """The addresses `host` (already IDNA-encoded) resolves to, as the system resolver answers."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return tuple(str(info[4][0]) for info in infos)


async def check(url: str, allow: frozenset[str]) -> Checked:
    """Refused unless `url` is http(s) and its host is listed or resolves to global addresses
    only; a name that does not resolve is refused too (nothing to fetch)."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        raise Refused("refused: not a well-formed URL") from None
    host = parsed.raw_host.decode("ascii")
    if parsed.scheme not in ("http", "https") or not host:
        raise Refused("refused: only http(s) URLs with a host are fetched")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if host in allow:
        return Checked(host, port, ())
    try:
        addresses: tuple[str, ...] = (str(ipaddress.ip_address(host)),)
    except ValueError:
        try:
            addresses = await resolve(host, port)
        except (OSError, UnicodeError):
            raise Refused(f"refused: {host} does not resolve") from None
    if not addresses or not all(_global(a) for a in addresses):
        raise _refused(host)
    return Checked(host, port, addresses)
