"""CallbackPolicy: which callback URLs the service may POST reports to.

Only http and https. Loopback, private, link-local, reserved and cloud-metadata addresses
are refused by default, judged on every address the host resolves to (not only a literal in
the URL), so a DNS name pointing inside the network is caught. An allow-list setting
(`SAAS_EVAL_CALLBACK_ALLOW`: host names, addresses or CIDR networks, comma-separated) opens
exceptions, e.g. for a receiver on the same machine.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from .errors import BatchRejected

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)


def _embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped, 6to4 or Teredo IPv6 address."""
    if isinstance(address, ipaddress.IPv6Address):
        teredo = address.teredo
        for inner in (address.ipv4_mapped, address.sixtofour, teredo[1] if teredo else None):
            if inner is not None:
                return inner
    return address


def _why_refused(address: IPAddress) -> str | None:
    address = _embedded_ipv4(address)
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    for attribute, words in (("is_loopback", "a loopback address"),
                             ("is_link_local", "a link-local address"),
                             ("is_private", "a private address"),
                             ("is_multicast", "a multicast address"),
                             ("is_unspecified", "an unspecified address"),
                             ("is_reserved", "a reserved address")):
        if getattr(address, attribute):
            return words
    if not address.is_global:  # shared address space (100.64/10), documentation ranges...
        return "not a public internet address"
    return None


class CallbackPolicy:
    """Checks callback URLs; `check` raises BatchRejected(callback_refused)."""

    def __init__(self, allow: str = "") -> None:
        self.hosts: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        for item in (part.strip() for part in allow.split(",")):
            if not item:
                continue
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                self.hosts.add(item.lower())

    def check(self, url: str) -> None:
        """Accept the URL or raise a rejection that says why."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise _refused(url, "only http:// and https:// URLs with a host are allowed")
        host = parts.hostname.lower()
        if host in self.hosts:
            return
        for address in self._resolve(url, host, parts.port or (443 if parts.scheme == "https"
                                                                 else 80)):
            if any(address in network for network in self.networks):
                continue
            reason = _why_refused(address)
            if reason:
                raise _refused(url, f"{host} resolves to {address}, {reason}")

    def _resolve(self, url: str, host: str, port: int) -> list[IPAddress]:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as exc:
            raise _refused(url, f"{host} does not resolve ({exc})") from exc
        return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]


def _refused(url: str, why: str) -> BatchRejected:
    return BatchRejected("callback_refused", f"callback_url {url!r} refused: {why}",
                         field="callback_url")
