"""Which `Host` header values the gateway answers (DNS rebinding: see middleware.trusted_host).

A page on attacker.example can make its name resolve to 127.0.0.1 and then call this server
as its own origin: the browser sends `Host: attacker.example`, CORS never applies. Such an
attack needs a name the attacker's DNS controls, so IP literals are always accepted, as are
`localhost` and its subdomains (loopback by RFC 6761), the `--host` name, and whatever
`--allowed-hosts` lists (`.example.com` = that domain and its subdomains; `*` = any host).
"""
from __future__ import annotations

import argparse
import ipaddress
from dataclasses import dataclass

from kvserve.frontend.http.cors_policy import ANY, json_list

_LOOPBACK_NAMES = ("localhost",)


def host_name(header: str) -> str:
    """The name part of a Host header, lower case, without port or trailing dot."""
    value = header.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def _matches(name: str, pattern: str) -> bool:
    pattern = pattern.lower().rstrip(".")
    if pattern.startswith("."):
        return name == pattern[1:] or name.endswith(pattern)
    return name == pattern


@dataclass(slots=True, frozen=True)
class HostPolicy:
    allowed: tuple[str, ...] = ()  # names beyond the defaults; ("*",): no check

    def allows(self, header: str | None) -> bool:
        if header is None or ANY in self.allowed:
            return True  # no Host header: not a browser (every browser sends one)
        name = host_name(header)
        if _is_ip(name):
            return True
        if any(name == n or name.endswith("." + n) for n in _LOOPBACK_NAMES):
            return True
        return any(_matches(name, p) for p in self.allowed)


def add_host_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--allowed-hosts", type=json_list, default=(), metavar="JSON",
                        help="Host header names the gateway answers besides IP addresses, localhost and --host, "
                             "as a JSON list: '[\"api.example.com\", \".svc.cluster.local\"]' or '[\"*\"]' "
                             "(any; off the DNS-rebinding check); others get 421")


def host_policy_from_args(args: argparse.Namespace) -> HostPolicy:
    bind = host_name(args.host)
    extra = () if not bind or _is_ip(bind) else (bind,)
    return HostPolicy(allowed=tuple(args.allowed_hosts) + extra)
