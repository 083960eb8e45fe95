"""CallbackPolicy: which callback URLs the service may POST reports to.

Only http and https. Loopback, private, link-local, reserved and cloud-metadata addresses
are refused by default, judged on every address the host resolves to (not only a literal in
the URL), so a DNS name pointing inside the network is caught. An allow-list setting
(`SAAS_EVAL_CALLBACK_ALLOW`: host names, addresses or CIDR networks, comma-separated) opens
exceptions, e.g. for a receiver on the same machine.

The URL is parsed with urllib3's `parse_url`, the parser the sender uses, and must mean the
same host and port to `urllib.parse` too; anything two parsers could read differently is
refused rather than interpreted: backslashes, whitespace, control or non-ASCII characters,
percent-encoding or `@` (user info) in the authority. `check` returns a `CallbackTarget`
holding the checked addresses; the sender connects to those addresses only (never resolving
the name again), so a name that re-resolves inside the network after the check (DNS
rebinding) is never reached.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from urllib3.util import parse_url

from ..errors import BatchRejected
from ..util.redact import shown_url

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200")
)
MAX_URL_LENGTH = 2048
_AUTHORITY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)")
_LABEL_RE = re.compile(r"^(?!-)[a-z0-9_-]{1,63}(?<!-)$")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class CallbackTarget:
    """A checked callback: where to connect (`addresses`, `port`) and what to send."""

    url: str
    scheme: str
    host: str  # lower-case name or bare IP literal; the TLS name and Host header
    port: int
    host_header: str
    request_uri: str
    addresses: tuple[IPAddress, ...]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (the default resolver of CallbackPolicy)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def _embedded_ipv4(address: IPAddress) -> IPAddress:
    """The IPv4 address inside an IPv4-mapped, 6to4 or Teredo IPv6 address."""
    if isinstance(address, ipaddress.IPv6Address):
        teredo = address.teredo
        for inner in (address.ipv4_mapped, address.sixtofour, teredo[1] if teredo else None):
            if inner is not None:
                return inner
    return address


def why_refused(address: IPAddress) -> str | None:
    """Why the service must not connect to `address` by default (None: public)."""
    address = _embedded_ipv4(address)
    if address in METADATA_ADDRESSES:
        return "a cloud metadata address"
    for attribute, words in (
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_site_local", "a site-local address"),  # fec0::/10: deprecated, still routed
        ("is_private", "a private address"),
        ("is_multicast", "a multicast address"),
        ("is_unspecified", "an unspecified address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(address, attribute, False):
            return words
    if not address.is_global:  # shared address space (100.64/10), documentation ranges...
        return "not a public internet address"
    return None


class CallbackPolicy:
    """Checks callback URLs; `check` raises BatchRejected(callback_refused).

    `resolver` (host, port) -> address strings is a seam for tests; by default the system's.
    """

    def __init__(self, allow: str = "", resolver: Resolver = system_resolver) -> None:
        self.hosts: set[str] = set()
        self.networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
        self.resolver = resolver
        for item in (part.strip() for part in allow.split(",")):
            if not item:
                continue
            try:
                self.networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                self.hosts.add(item.lower().rstrip("."))

    def check(self, url: str) -> CallbackTarget:
        """Accept the URL and return where to connect, or raise a rejection that says why."""
        target = _parse(url)
        named = target.host.rstrip(".") in self.hosts
        addresses = self._resolve(url, target.host, target.port)
        for address in addresses:
            if named or self.allows(address):
                continue
            raise _refused(url, f"{target.host} resolves to {address}, {why_refused(address)}")
        return CallbackTarget(
            target.url,
            target.scheme,
            target.host,
            target.port,
            target.host_header,
            target.request_uri,
            addresses,
        )

    def check_unresolved(self, url: str) -> None:
        """What `check` refuses without looking a name up: the URL's form, and an address
        written in it (`dropbox-eval validate`, away from the service's network)."""
        if _looked_up_locally(_parse(url).host):
            self.check(url)  # an address in any spelling, or localhost: no DNS is asked

    def allows(self, address: IPAddress) -> bool:
        """Whether the policy lets a connection reach `address` (allow-list or public)."""
        if any(address in network for network in self.networks):
            return True
        return why_refused(address) is None

    def _resolve(self, url: str, host: str, port: int) -> tuple[IPAddress, ...]:
        try:
            return (ipaddress.ip_address(host),)
        except ValueError:
            pass
        try:
            found = self.resolver(host, port)
            addresses = tuple(dict.fromkeys(ipaddress.ip_address(a.split("%")[0]) for a in found))
        except (OSError, UnicodeError, ValueError) as exc:
            raise _refused(url, f"{host} does not resolve ({exc})") from exc
        if not addresses:
            raise _refused(url, f"{host} does not resolve")
        return addresses


def _parse(url: str) -> CallbackTarget:
    """Split `url` exactly as the sender will, refusing anything ambiguous or malformed."""
    if not isinstance(url, str) or not url:
        raise _refused(str(url), "a callback URL must be a non-empty string")
    if len(url) > MAX_URL_LENGTH:
        raise _refused(url, f"longer than {MAX_URL_LENGTH} characters")
    bad = next(
        (c for c in url if c == "\\" or c.isspace() or not c.isprintable() or not c.isascii()), None
    )
    if bad is not None:
        raise _refused(
            url,
            f"the character {bad!r} is not allowed (backslash, whitespace, "
            "control and non-ASCII characters are refused; percent-encode "
            "the path)",
        )
    match = _AUTHORITY_RE.match(url)
    if match is None or not match.group(1):
        raise _refused(url, "only http:// and https:// URLs with a host are allowed")
    authority = match.group(1)
    for char, why in (
        ("@", "user info (user:password@) is not allowed"),
        ("%", "percent-encoding is not allowed in the host"),
    ):
        if char in authority:
            raise _refused(url, why)
    try:
        parsed = parse_url(url)
        split = urlsplit(url)
        split_host, split_port = split.hostname, split.port
    except ValueError as exc:  # urllib3's LocationParseError is a ValueError
        raise _refused(url, f"not a valid URL ({exc})") from exc
    scheme = (parsed.scheme or "").lower()
    if scheme not in _DEFAULT_PORTS or not parsed.host:
        raise _refused(url, "only http:// and https:// URLs with a host are allowed")
    host = parsed.host.lower().strip("[]")
    port = parsed.port if parsed.port is not None else _DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise _refused(url, f"port {port} is out of range")
    if (split_host, split_port or _DEFAULT_PORTS[scheme]) != (host, port):
        raise _refused(url, "the URL is ambiguous (parsers disagree on its host or port)")
    if not (_is_ip(host) or _is_host_name(host)):
        raise _refused(url, f"{host!r} is not a valid host name")
    return CallbackTarget(url, scheme, host, port, str(parsed.netloc), parsed.request_uri, ())


def _is_host_name(host: str) -> bool:
    name = host[:-1] if host.endswith(".") else host
    return len(name) <= 253 and all(_LABEL_RE.match(label) for label in name.split("."))


def _looked_up_locally(host: str) -> bool:
    """Hosts whose addresses need no DNS: an address in any form the C resolver reads as
    one (`127.1`, `0x7f000001`, `2130706433`, with a trailing dot or not) and `localhost`
    and its subdomains (RFC 6761)."""
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        socket.getaddrinfo(name, None, flags=socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return False
    return True


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _refused(url: str, why: str) -> BatchRejected:
    """The rejection, echoing the URL without its user info (a credential) and cut short."""
    shown = shown_url(url)
    shown = shown if len(shown) <= 80 else shown[:80] + "..."
    return BatchRejected(
        "callback_refused", f"callback_url {shown!r} refused: {why}", field="callback_url"
    )
