"""Several backends behind one `BackendClient`: how a deployment grows past one
machine (`kvserve serve --triton-url A --triton-url B`, `dns://NAME:PORT`, or
`--triton-urls-file FILE`).

Routing (routing.py): among the ready replicas, prefix affinity (rendezvous
hash of the first prompt block) unless that replica is much busier than the
least loaded one, else the least loaded (fewest requests in flight from this
gateway; ties go to the one that got fewer requests so far).

Failures. A request is *not yet started* until its first response arrived;
nothing has reached the client then, so it can be moved:
- its replica fails (transport error) -> the replica is taken out and the
  request retried on another one (`decision="retry"`), each replica at most once;
- its replica is taken out by someone else (a sibling request's transport
  error, a failed health check, it left DNS) -> the request stops waiting
  there and is retried elsewhere; a silent peer is noticed this way within a
  health interval, not after gRPC keepalive gives up;
- the engine refuses it as overloaded -> tried on the others.
A started request whose replica fails ends with `BackendUnavailable`, which
the HTTP layer turns into an error event: never a hang (transport errors
surface at once on a reset connection, through gRPC keepalive on a silent one).

Health: every replica is checked (ServerReady + ModelReady) every
`health_interval` seconds; one failed check takes it out, one passing check
brings it back. `ready()` runs a fresh round: true while any replica is ready.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Sequence

from kvserve.frontend.backend_client.protocol import (BackendClient, BackendError, BackendRejected, BackendUnavailable, ChoiceDelta,
                                                 EngineControl, GenerateRequest, LoRAAdapterInfo, LoRAControl, ModelFacts)
from kvserve.frontend.backend_client.replicas.metrics_merge import merge_exposition
from kvserve.frontend.backend_client.replicas.router_metrics import RouterMetrics
from kvserve.frontend.backend_client.replicas.routing import RoutingPolicy, choose
from kvserve.frontend.backend_client.replicas.routing_key import KeyFunction
from kvserve.frontend.backend_client.replicas.sources import Source, Target, gather_targets

log = logging.getLogger("kvserve.frontend.backend_client.replicas")

ClientFactory = Callable[[Target], BackendClient]
_CHECK_TIMEOUT_S = 5.0  # a health check that hangs longer counts as failed


@dataclass(slots=True, eq=False)
class Replica:
    name: str
    client: BackendClient
    ready: bool = True
    outstanding: int = 0
    routed: int = 0
    removed: bool = False
    # Set while the replica is out of rotation: wakes the requests still waiting
    # there for their first response, so they move elsewhere.
    down: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True, frozen=True)
class ReplicaStatus:
    name: str
    ready: bool
    outstanding: int


class _Pulled(Exception):
    """The replica was taken out while this request waited there for its first response."""


class ReplicaSet:
    def __init__(
        self,
        replicas: Sequence[BackendClient] = (),
        *,
        sources: Sequence[Source] = (),
        client_factory: ClientFactory | None = None,
        policy: RoutingPolicy | None = None,
        prefix_key: KeyFunction | None = None,
        health_interval: float = 2.0,
        discovery_interval: float = 5.0,
        display_name: str | None = None,
    ) -> None:
        if not replicas and not sources:
            raise ValueError("ReplicaSet needs at least one backend or a source of them")
        if sources and client_factory is None:
            raise ValueError("replica sources need a client factory")
        self.policy = policy or RoutingPolicy()
        self._prefix_key = prefix_key
        self._sources = list(sources)
        self._factory = client_factory
        self._health_interval = health_interval
        self._discovery_interval = discovery_interval
        self._metrics = RouterMetrics()
        self._replicas: list[Replica] = []
        self._draining: list[Replica] = []  # removed from discovery, requests still in flight
        for client in replicas:
            self._add(client.name, client)
        self._label_single = bool(self._sources) or len(self._replicas) != 1
        self._task: asyncio.Task[None] | None = None
        self._round: asyncio.Task[None] | None = None
        self._discovered_at = float("-inf")
        self._closed = False
        self._display_name = display_name

    @property
    def name(self) -> str:
        return self._display_name or ",".join(r.name for r in self._replicas)

    def replica_status(self) -> list[ReplicaStatus]:
        return [ReplicaStatus(r.name, r.ready, r.outstanding) for r in self._replicas]

    # ---- membership -------------------------------------------------------------------------
    def _add(self, name: str, client: BackendClient, *, ready: bool = True) -> Replica:
        replica = Replica(name, client, ready=ready)
        if not ready:
            replica.down.set()
        self._replicas.append(replica)
        self._metrics.add_replica(name)
        self._metrics.set_ready(name, ready)
        return replica

    async def _discover(self) -> None:
        if not self._sources or time.monotonic() - self._discovered_at < self._discovery_interval:
            return
        self._discovered_at = time.monotonic()
        targets = await gather_targets(self._sources)
        wanted = {t.grpc_url: t for t in targets}
        current = {r.name for r in self._replicas}
        for target in targets:
            if target.grpc_url not in current:
                assert self._factory is not None
                self._add(target.grpc_url, self._factory(target), ready=False)  # checked in this round
                log.info("replica %s joined", target.grpc_url)
        for replica in [r for r in self._replicas if r.name not in wanted]:
            self._replicas.remove(replica)
            replica.removed = True
            replica.ready = False
            replica.down.set()
            self._metrics.remove_replica(replica.name)
            log.info("replica %s left", replica.name)
            if replica.outstanding:
                self._draining.append(replica)
            else:
                await replica.client.close()

    async def _release(self, replica: Replica) -> None:
        if replica.removed and replica.outstanding == 0 and replica in self._draining:
            self._draining.remove(replica)
            await replica.client.close()

    # ---- health -----------------------------------------------------------------------------
    def _set_ready(self, replica: Replica, ready: bool, reason: str = "") -> None:
        if replica.removed:
            return
        if ready and not replica.ready:
            log.info("replica %s is ready", replica.name)
            replica.down.clear()
        elif not ready and replica.ready:
            log.warning("replica %s taken out: %s", replica.name, reason or "health check failed")
            replica.down.set()
        replica.ready = ready
        self._metrics.set_ready(replica.name, ready)

    async def _check(self, replica: Replica) -> None:
        try:
            ok = await asyncio.wait_for(replica.client.ready(), _CHECK_TIMEOUT_S)
        except asyncio.TimeoutError:
            ok = False
        except Exception as exc:  # a broken client must not stop the health loop
            log.warning("health check of %s raised %r", replica.name, exc)
            ok = False
        self._set_ready(replica, ok, "not ready (ServerReady/ModelReady)")

    async def _health_round(self) -> None:
        try:
            await self._discover()
        except Exception as exc:  # keep checking the replicas we have
            # The reason in the line itself (a DNS or file error about the operator's own
            # configuration): above DEBUG the log shows an exception's type only.
            log.error("replica discovery failed: %r", exc)
            log.debug("replica discovery failure", exc_info=True)
        await asyncio.gather(*(self._check(r) for r in list(self._replicas)))

    async def _shared_round(self) -> None:
        # Concurrent callers (the loop, /health, readiness) share one round in flight.
        if self._round is None or self._round.done():
            self._round = asyncio.ensure_future(self._health_round())
        await asyncio.shield(self._round)

    async def _health_loop(self) -> None:
        while True:
            try:
                await self._shared_round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replica health round failed")
            await asyncio.sleep(self._health_interval)

    def _ensure_started(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._health_loop(), name="kvserve-replica-health")

    async def ready(self) -> bool:
        self._ensure_started()
        try:
            await self._shared_round()
        except Exception:
            log.exception("replica health round failed")
        return any(r.ready for r in self._replicas)

    # ---- routing ----------------------------------------------------------------------------
    def _route(self, key: bytes | None, tried: set[Replica]) -> tuple[Replica, str]:
        untried = [r for r in self._replicas if r not in tried]
        candidates = [r for r in untried if r.ready]
        if not candidates and not tried and untried:
            # Every replica is marked out: the marks may be a second old, and
            # one fast failure is better than refusing outright.
            candidates = untried
        if not candidates:
            raise BackendUnavailable("no ready replica")
        return choose(candidates, key, self.policy, retry=bool(tried))

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        self._ensure_started()
        key = self._prefix_key(request) if self._prefix_key is not None and self.policy.prefix_affinity else None
        tried: set[Replica] = set()
        last_error: BackendError | None = None
        while True:
            try:
                replica, decision = self._route(key, tried)
            except BackendUnavailable:
                if last_error is not None:
                    raise last_error from None
                raise
            tried.add(replica)
            watch = replica.ready  # a replica tried while marked out is not pulled for being out
            replica.outstanding += 1
            replica.routed += 1
            self._metrics.routed(replica.name, decision)
            self._metrics.set_outstanding(replica.name, replica.outstanding)
            stream = replica.client.generate(request)
            started = False
            try:
                first = await self._first_delta(replica, stream, watch)
                if first is None:
                    return
                started = True
                yield first
                async for delta in stream:
                    yield delta
                return
            except BackendUnavailable as exc:
                self._set_ready(replica, False, str(exc))
                if started:
                    raise
                last_error = exc
                log.warning("request %s not started on %s (%s); retrying elsewhere", request.request_id, replica.name, exc)
            except _Pulled:
                last_error = BackendUnavailable(f"replica {replica.name} was taken out")
                log.warning("request %s was waiting on %s, which was taken out; retrying elsewhere",
                            request.request_id, replica.name)
            except BackendRejected as exc:
                if started or not exc.overloaded:
                    raise
                last_error = exc
            finally:
                replica.outstanding -= 1
                if not replica.removed:
                    self._metrics.set_outstanding(replica.name, replica.outstanding)
                await stream.aclose()  # type: ignore[attr-defined]
                await self._release(replica)

    async def _first_delta(self, replica: Replica, stream: AsyncIterator[ChoiceDelta], watch: bool) -> ChoiceDelta | None:
        """The stream's first delta (None if it ended without one); raises
        _Pulled when `watch` is set and the replica is taken out first."""
        if not watch:
            try:
                return await stream.__anext__()
            except StopAsyncIteration:
                return None
        first = asyncio.ensure_future(stream.__anext__())
        pulled = asyncio.ensure_future(replica.down.wait())
        try:
            await asyncio.wait((first, pulled), return_when=asyncio.FIRST_COMPLETED)
        finally:
            pulled.cancel()
            if not first.done():
                first.cancel()  # cancels the backend request
                await asyncio.gather(first, return_exceptions=True)
        if first.cancelled():
            raise _Pulled()
        try:
            return first.result()
        except StopAsyncIteration:
            return None

    async def describe(self) -> ModelFacts | None:
        """The first ready replica's answer (replicas of one deployment serve one model).
        BackendUnavailable when no replica answered at all (so the gateway asks again)."""
        failed = False
        for replica in [r for r in self._replicas if r.ready]:
            try:
                facts = await replica.client.describe()
            except BackendUnavailable:
                failed = True
                continue
            if facts is not None:
                return facts
        if failed:
            raise BackendUnavailable("no replica answered the describe request")
        return None

    async def lora_control(self, action: str, lora_name: str | None = None,
                           lora_path: str | None = None) -> list[LoRAAdapterInfo]:
        """list: the first ready replica's adapters. load and unload: applied to every ready replica
        (each runs its own engine), the answer of the first; a refusal by any replica is raised
        (the same files and names give the same refusal everywhere). A replica that was out
        while an adapter was loaded does not have it: load it again once the replica is back."""
        replicas = [r for r in self._replicas if r.ready and isinstance(r.client, LoRAControl)]
        if not replicas:
            raise BackendUnavailable("no ready replica")
        if action == "list":
            last: BackendError | None = None
            for replica in replicas:
                try:
                    return await replica.client.lora_control(action)  # type: ignore[attr-defined]
                except BackendUnavailable as exc:
                    last = exc
            assert last is not None
            raise last
        answers = await asyncio.gather(*(r.client.lora_control(action, lora_name, lora_path)  # type: ignore[attr-defined]
                                         for r in replicas), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return answers[0]  # type: ignore[return-value]

    async def engine_control(self, action: str) -> dict[str, Any]:
        """Applied to every ready replica (each runs its own engine); the blocks forgotten summed.
        A replica that is out misses it, and keeps its cache when it comes back."""
        replicas = [r for r in self._replicas if r.ready and isinstance(r.client, EngineControl)]
        if not replicas:
            raise BackendUnavailable("no ready replica")
        answers = await asyncio.gather(
            *(r.client.engine_control(action) for r in replicas), return_exceptions=True)  # type: ignore[attr-defined]
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        forgotten = sum(int(a.get("forgotten_blocks") or 0) for a in answers)  # type: ignore[union-attr]
        return {"action": action, "forgotten_blocks": forgotten}

    # ---- metrics and shutdown ---------------------------------------------------------------
    async def metrics_text(self) -> str:
        replicas = list(self._replicas)
        texts = await asyncio.gather(*(r.client.metrics_text() for r in replicas), return_exceptions=True)
        texts = [t if isinstance(t, str) else "" for t in texts]
        if not self._label_single and len(texts) == 1:
            backend = texts[0]
        else:
            backend = merge_exposition({r.name: t for r, t in zip(replicas, texts) if t})
        router = self._metrics.render()
        return router + ("" if router.endswith("\n") or not router else "\n") + backend

    async def close(self) -> None:
        self._closed = True
        for task in (self._task, self._round):
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in (self._task, self._round) if t is not None), return_exceptions=True)
        clients = [r.client for r in self._replicas + self._draining]
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

