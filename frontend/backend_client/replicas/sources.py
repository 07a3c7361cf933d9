"""Where the list of replicas comes from, re-read while the gateway runs.

- a fixed `--triton-url HOST:PORT` is one replica;
- `--triton-url dns://NAME:PORT` is every address NAME resolves to (a
  Kubernetes headless Service answers with one A record per ready pod),
  re-resolved on an interval, so pods that come and go join and leave;
- `--triton-urls-file FILE` lists replicas one per line (`GRPC [METRICS_URL]`,
  `#` comments; `dns://` lines allowed), re-read when its mtime changes.

A source that fails to refresh (DNS down, file briefly missing during an
atomic rename) keeps its last good answer: losing every replica because of a
resolver hiccup would turn a small fault into an outage.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Protocol, Sequence

log = logging.getLogger("kvserve.frontend.backend_client.replicas")

DNS_PREFIXES = ("dns:///", "dns://")
_RESOLVE_TIMEOUT_S = 5.0  # getaddrinfo runs on a thread and may block for long


@dataclass(slots=True, frozen=True)
class Target:
    grpc_url: str  # HOST:PORT, the replica's name in logs and metric labels
    metrics_url: str | None = None  # None: the tritonserver convention, gRPC port + 1


def default_metrics_url(grpc_url: str) -> str | None:
    host, _, port = grpc_url.rpartition(":")
    return f"http://{host}:{int(port) + 1}/metrics" if host and port.isdigit() else None


def _split_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def _join(host: str, port: int) -> str:
    try:
        if ipaddress.ip_address(host).version == 6:
            return f"[{host}]:{port}"
    except ValueError:
        pass
    return f"{host}:{port}"


class Source(Protocol):
    async def targets(self) -> list[Target]: ...


class StaticSource:
    def __init__(self, targets: Sequence[Target]) -> None:
        self._targets = list(targets)

    async def targets(self) -> list[Target]:
        return list(self._targets)


Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve_addresses(host: str, port: int) -> list[str]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({info[4][0] for info in infos})


class DnsSource:
    """Every address of NAME, one replica each (named by address, so the name
    is stable for affinity hashing and metric labels)."""

    def __init__(self, host: str, port: int, resolver: Resolver = resolve_addresses) -> None:
        self.host, self.port = host, port
        self._resolve = resolver
        self._last: list[Target] = []

    @classmethod
    def parse(cls, url: str, resolver: Resolver = resolve_addresses) -> DnsSource:
        for prefix in DNS_PREFIXES:
            if url.startswith(prefix):
                return cls(*_split_host_port(url[len(prefix):]), resolver=resolver)
        raise ValueError(f"{url!r}: expected dns://NAME:PORT")

    async def targets(self) -> list[Target]:
        try:
            addresses = await asyncio.wait_for(self._resolve(self.host, self.port), _RESOLVE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as exc:
            log.warning("cannot resolve %s: %s; keeping %d replica(s)", self.host, exc, len(self._last))
            return list(self._last)
        if not addresses and self._last:
            log.warning("%s resolved to no address; keeping %d replica(s)", self.host, len(self._last))
            return list(self._last)
        self._last = [Target(_join(a, self.port)) for a in addresses]
        return list(self._last)


def is_dns_url(url: str) -> bool:
    return url.startswith(DNS_PREFIXES)


def parse_urls_file(text: str) -> tuple[list[Target], list[str]]:
    """(fixed targets, dns:// urls) listed in a urls file."""
    targets: list[Target] = []
    dns: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"line {number}: expected `GRPC_URL [METRICS_URL]`, got {raw!r}")
        if is_dns_url(parts[0]):
            dns.append(parts[0])
            continue
        _split_host_port(parts[0])
        targets.append(Target(parts[0], parts[1] if len(parts) == 2 else None))
    return targets, dns


class UrlsFileSource:
    def __init__(self, path: str | os.PathLike[str], resolver: Resolver = resolve_addresses) -> None:
        self.path = Path(path)
        self._resolver = resolver
        self._mtime: int | None = None
        self._fixed: list[Target] = []
        self._dns: dict[str, DnsSource] = {}

    def _reload_if_changed(self) -> None:
        try:
            mtime = self.path.stat().st_mtime_ns
            if mtime == self._mtime:
                return
            fixed, dns = parse_urls_file(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s: %s; keeping the previous replica list", self.path, exc)
            return
        self._mtime = mtime
        self._fixed = fixed
        self._dns = {u: self._dns.get(u) or DnsSource.parse(u, self._resolver) for u in dns}
        log.info("replica list %s: %d url(s), %d dns name(s)", self.path, len(fixed), len(dns))

    async def targets(self) -> list[Target]:
        self._reload_if_changed()
        out = list(self._fixed)
        for source in self._dns.values():
            out.extend(await source.targets())
        return out


def sources_from_flags(urls: Sequence[str], metrics_urls: Sequence[str], urls_file: str | None,
                       resolver: Resolver = resolve_addresses) -> list[Source]:
    """`--triton-url` (repeatable; `--triton-metrics-url` pairs with the fixed ones in order)
    and `--triton-urls-file` as sources."""
    fixed: list[Target] = []
    sources: list[Source] = []
    explicit = list(metrics_urls)
    for url in urls:
        if is_dns_url(url):
            sources.append(DnsSource.parse(url, resolver))
        else:
            _split_host_port(url)
            fixed.append(Target(url, explicit.pop(0) if explicit else None))
    if fixed:
        sources.insert(0, StaticSource(fixed))
    if urls_file:
        sources.append(UrlsFileSource(urls_file, resolver))
    return sources


async def gather_targets(sources: Sequence[Source]) -> list[Target]:
    """The union of every source's targets; the first mention of a URL wins."""
    seen: dict[str, Target] = {}
    for source in sources:
        for target in await source.targets():
            seen.setdefault(target.grpc_url, target)
    return list(seen.values())
