"""Routing between replicas without servers: the policy, the affinity key, the
ReplicaSet's retries and health, discovery from DNS and a urls file, flags."""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvserve.frontend.backend_client.protocol import BackendRejected, BackendUnavailable
from kvserve.frontend.backend_client.replicas.flags import build_backend, validate_replica_flags
from kvserve.frontend.backend_client.replicas.replica_set import ReplicaSet
from kvserve.frontend.backend_client.replicas.routing import RoutingPolicy, choose, rendezvous_order
from kvserve.frontend.backend_client.replicas.routing_key import PrefixKey
from kvserve.frontend.backend_client.replicas.sources import (DnsSource, Target, UrlsFileSource, parse_urls_file,
                                                              sources_from_flags)
from kvserve.frontend.backend_client.triton_client import TritonBackendClient
from kvserve.frontend.cli.serve_cmd import build_parser, plan_from_args
from kvserve.seam.tokenizer import ModelTokenizer

from scale_fakes import ScriptedReplica, drain, req


@dataclass
class C:
    name: str
    outstanding: int = 0
    routed: int = 0


def samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# ---- policy ----------------------------------------------------------------------------------
def test_affinity_prefers_the_rendezvous_winner_until_it_is_much_busier() -> None:
    policy = RoutingPolicy(load_factor=2.0, load_slack=4)
    cs = [C("a:1"), C("b:1"), C("c:1")]
    key = b"some-prefix"
    winner = rendezvous_order(key, [c.name for c in cs])[0]
    w = next(c for c in cs if c.name == winner)
    assert choose(cs, key, policy) == (w, "affinity")
    for c in cs:
        c.outstanding = 3
    w.outstanding = 2 * 3 + 4  # at the bound: still affinity
    assert choose(cs, key, policy) == (w, "affinity")
    w.outstanding += 1  # beyond it: the least loaded takes the request
    chosen, decision = choose(cs, key, policy)
    assert decision == "least_loaded" and chosen is not w and chosen.outstanding == 3
    assert choose(cs, key, RoutingPolicy(prefix_affinity=False))[1] == "least_loaded"
    assert choose(cs, key, policy, retry=True)[1] == "retry"
    with pytest.raises(ValueError):
        RoutingPolicy(load_factor=0.5)


def test_least_loaded_breaks_ties_by_fewest_routed_so_idle_replicas_take_turns() -> None:
    cs = [C("a"), C("b"), C("c")]
    order = []
    for _ in range(6):
        c, decision = choose(cs, None, RoutingPolicy())
        assert decision == "least_loaded"
        c.routed += 1
        order.append(c.name)
    assert order == ["a", "b", "c", "a", "b", "c"]
    cs[0].outstanding = 1
    assert choose(cs, None, RoutingPolicy())[0].name == "b"


def test_rendezvous_moves_only_the_keys_of_a_replica_that_leaves() -> None:
    names = [f"10.0.0.{i}:8001" for i in range(4)]
    keys = [f"k{i}".encode() for i in range(2000)]
    before = {k: rendezvous_order(k, names)[0] for k in keys}
    counts = {n: sum(1 for v in before.values() if v == n) for n in names}
    assert all(350 < c < 650 for c in counts.values()), counts  # spread, roughly 500 each
    after = {k: rendezvous_order(k, names[:3])[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == names[3] for k in moved)


# ---- affinity key ----------------------------------------------------------------------------
def test_prefix_key_is_the_first_full_block_plus_cache_salt() -> None:
    key = PrefixKey(None, block_size=16)
    a = key(req("1", list(range(16)) + [99, 98]))
    assert a is not None and a == key(req("2", list(range(16)) + [1]))
    assert a != key(req("3", [1] + list(range(1, 16)) + [99]))
    assert key(req("4", list(range(15)))) is None  # no full block: nothing to cache
    assert a != key(req("5", list(range(16)), cache_salt="tenant-b"))
    assert key(req("6", "text without a tokenizer")) is None


def test_prefix_key_of_text_matches_the_tokens_it_stands_for(llama_dir: str) -> None:
    tok = ModelTokenizer.from_folder(llama_dir)
    key = PrefixKey(tok, block_size=16)
    system = "You are a careful assistant who answers questions about the paged KV cache. " * 3
    long_a = system + "What is a block table? " + "Explain slowly. " * 200
    long_b = system + "Why share blocks?"
    assert key(req("a", long_a)) == key(req("b", long_b)) is not None
    ids = tok.encode(long_b, add_special_tokens=True)
    assert key(req("c", ids)) == key(req("b", long_b))
    assert key(req("d", "short")) is None


def test_prefix_key_never_tokenizes_a_whole_long_prompt_on_the_event_loop() -> None:
    class FewTokens:  # a text whose characters make very few tokens (long runs)
        def __init__(self, chars_per_token: int) -> None:
            self.chars_per_token = chars_per_token
            self.seen: list[int] = []

        def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
            self.seen.append(len(text))
            return list(range(len(text) // self.chars_per_token))

    sparse = FewTokens(1000)
    assert PrefixKey(sparse, block_size=16)(req("a", "x" * 2_000_000)) is None  # type: ignore[arg-type]
    assert max(sparse.seen) < 10_000  # no stable first block within the wider slice: no key
    denser = FewTokens(100)
    assert PrefixKey(denser, block_size=16)(req("b", "x" * 2_000_000)) is not None  # type: ignore[arg-type]
    assert max(denser.seen) < 10_000  # the wider slice holds enough tokens: keyed from it


# ---- ReplicaSet ------------------------------------------------------------------------------
def test_a_request_not_yet_started_moves_when_its_replica_fails() -> None:
    async def body() -> None:
        a, b = ScriptedReplica("a", fail_before_first=True), ScriptedReplica("b")
        rs = ReplicaSet([a, b], health_interval=60)
        assert await rs.ready()
        a.is_ready = False  # it died: requests and health checks fail alike
        out = await drain(rs.generate(req("r1")))
        assert [d.text for d in out] == ["b0", "b1", "b2"]
        assert a.seen == ["r1"] and b.seen == ["r1"]
        assert [(s.name, s.ready) for s in rs.replica_status()] == [("a", False), ("b", True)]
        m = samples(await rs.metrics_text())
        assert m[("kvserve:router_requests_total", (("decision", "least_loaded"), ("replica", "a")))] == 1
        assert m[("kvserve:router_requests_total", (("decision", "retry"), ("replica", "b")))] == 1
        assert m[("kvserve:router_replica_ready", (("replica", "a"),))] == 0
        # the failed replica gets nothing until a health check passes
        await drain(rs.generate(req("r2")))
        assert a.seen == ["r1"]
        a.fail_before_first, a.is_ready = False, True
        assert await rs.ready()
        await drain(rs.generate(req("r3")))
        assert a.seen == ["r1", "r3"]
        await rs.close()
        assert a.closed and b.closed
    asyncio.run(body())


def test_a_started_request_ends_with_an_error_and_is_not_repeated() -> None:
    async def body() -> None:
        a, b = ScriptedReplica("a", fail_after_first=True), ScriptedReplica("b")
        rs = ReplicaSet([a, b], health_interval=60)
        got = []
        with pytest.raises(BackendUnavailable):
            async for d in rs.generate(req("r1")):
                got.append(d.text)
        assert got == ["a0"] and b.seen == []
        assert not rs.replica_status()[0].ready
        await rs.close()
    asyncio.run(body())


def test_requests_waiting_on_a_replica_move_when_it_is_taken_out() -> None:
    async def body() -> None:
        hold = asyncio.Event()  # a's engine queue never moves: its peer went silent
        a, b = ScriptedReplica("a", hold=hold), ScriptedReplica("b", hold=asyncio.Event())
        rs = ReplicaSet([a, b], health_interval=60)
        tasks = [asyncio.create_task(drain(rs.generate(req(f"r{i}")))) for i in range(4)]
        await asyncio.sleep(0.05)
        assert sorted(a.seen) == ["r0", "r2"] and sorted(b.seen) == ["r1", "r3"]
        assert [s.outstanding for s in rs.replica_status()] == [2, 2]
        a.is_ready = False
        assert await rs.ready()  # the health round takes a out; b is still ready
        b.hold.set()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert all([d.text for d in r] == ["b0", "b1", "b2"] for r in results)
        assert sorted(a.cancelled) == ["r0", "r2"]  # their requests on a were cancelled there
        assert [s.outstanding for s in rs.replica_status()] == [0, 0]
        await rs.close()
    asyncio.run(body())


def test_overloaded_replicas_are_skipped_and_the_last_answer_stands() -> None:
    async def body() -> None:
        a, b = ScriptedReplica("a", overloaded=True), ScriptedReplica("b")
        rs = ReplicaSet([a, b], health_interval=60)
        assert [d.text for d in await drain(rs.generate(req("r1")))][0] == "b0"
        assert rs.replica_status()[0].ready  # overloaded is not unhealthy
        b.overloaded = True
        with pytest.raises(BackendRejected) as info:
            await drain(rs.generate(req("r2")))
        assert info.value.overloaded
        a.is_ready = b.is_ready = False
        assert not await rs.ready()
        await rs.close()
    asyncio.run(body())


def test_same_first_block_lands_on_one_replica_and_spills_when_it_is_busy() -> None:
    async def body() -> None:
        replicas = [ScriptedReplica(n, hold=asyncio.Event()) for n in ("a", "b", "c")]
        rs = ReplicaSet(replicas, prefix_key=PrefixKey(None), policy=RoutingPolicy(load_factor=2, load_slack=2),
                        health_interval=60)
        shared = list(range(100, 116))
        tasks = [asyncio.create_task(drain(rs.generate(req(f"r{i}", shared + [i])))) for i in range(6)]
        await asyncio.sleep(0.05)
        counts = sorted(len(r.seen) for r in replicas)
        # affinity while outstanding <= 2 * min + 2: three, then one each to the idle
        # ones, then affinity again (3 <= 2 * 1 + 2)
        assert counts == [1, 1, 4], counts
        for r in replicas:
            r.hold.set()
        await asyncio.gather(*tasks)
        m = samples(await rs.metrics_text())
        decisions = {}
        for (name, labels), v in m.items():
            if name == "kvserve:router_requests_total":
                decisions[dict(labels)["decision"]] = decisions.get(dict(labels)["decision"], 0) + v
        assert decisions == {"affinity": 4, "least_loaded": 2, "retry": 0}
        await rs.close()
    asyncio.run(body())


def test_metrics_text_labels_each_replica_and_adds_the_router_families() -> None:
    async def body() -> None:
        rs = ReplicaSet([ScriptedReplica("h1:8001"), ScriptedReplica("h2:8001")], health_interval=60)
        m = samples(await rs.metrics_text())
        assert m[("kvserve:num_requests_running", (("replica", "h1:8001"),))] == 1
        assert m[("kvserve:router_outstanding_requests", (("replica", "h2:8001"),))] == 0
        await rs.close()
    asyncio.run(body())


# ---- discovery -------------------------------------------------------------------------------
def test_urls_file_is_reread_when_it_changes_and_in_flight_requests_drain(tmp_path: Path) -> None:
    async def body() -> None:
        path = tmp_path / "replicas.txt"
        path.write_text("# replicas\nh1:8001\nh2:8001 http://h2:9000/metrics\n")
        made: dict[str, ScriptedReplica] = {}

        def factory(t: Target) -> ScriptedReplica:
            made[t.grpc_url] = ScriptedReplica(t.grpc_url, hold=asyncio.Event())
            return made[t.grpc_url]

        rs = ReplicaSet(sources=[UrlsFileSource(path)], client_factory=factory, health_interval=0.05,
                        discovery_interval=0.05)
        assert await rs.ready()
        assert [s.name for s in rs.replica_status()] == ["h1:8001", "h2:8001"]
        in_flight = asyncio.create_task(drain(rs.generate(req("r1"))))
        await asyncio.sleep(0.05)
        assert made["h1:8001"].seen == ["r1"]
        made["h1:8001"].hold = None  # let it finish once it is released below
        path.write_text("h2:8001\nh3:8001\n")
        os.utime(path, ns=(1, 10**18))  # a new mtime even on coarse clocks
        await asyncio.sleep(0.2)
        assert [s.name for s in rs.replica_status()] == ["h2:8001", "h3:8001"]
        # r1 was waiting on h1, which left: it moved and completes elsewhere
        made["h2:8001"].hold.set()
        made["h3:8001"].hold.set()
        out = await asyncio.wait_for(in_flight, 5)
        assert out[0].text in ("h2:80010", "h3:80010")
        assert made["h1:8001"].closed
        await rs.close()
    asyncio.run(body())


def test_dns_source_follows_the_answers_and_keeps_the_last_good_one() -> None:
    async def body() -> None:
        answers: list[object] = [["10.0.0.2", "10.0.0.1"], ["10.0.0.1", "10.0.0.3", "fd00::7"], OSError("SERVFAIL"), []]

        async def resolver(host: str, port: int) -> list[str]:
            assert (host, port) == ("triton-headless.ns.svc", 8001)
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return sorted(answer)

        src = DnsSource.parse("dns:///triton-headless.ns.svc:8001", resolver)
        assert [t.grpc_url for t in await src.targets()] == ["10.0.0.1:8001", "10.0.0.2:8001"]
        third = ["10.0.0.1:8001", "10.0.0.3:8001", "[fd00::7]:8001"]
        assert [t.grpc_url for t in await src.targets()] == third
        assert [t.grpc_url for t in await src.targets()] == third  # resolver failed: keep
        assert [t.grpc_url for t in await src.targets()] == third  # empty answer: keep
    asyncio.run(body())


def test_urls_file_and_flag_parsing(llama_dir: str) -> None:
    fixed, dns = parse_urls_file("a:1  # first\n\ndns://svc:8001\nb:2 http://b:3/metrics\n")
    assert fixed == [Target("a:1"), Target("b:2", "http://b:3/metrics")] and dns == ["dns://svc:8001"]
    with pytest.raises(ValueError):
        parse_urls_file("no-port\n")
    sources = sources_from_flags(["a:1", "dns://svc:8001", "b:2"], ["http://a:9/metrics"], None)
    assert len(sources) == 2

    def parse(*argv: str):
        return build_parser().parse_args(list(argv))

    tok = llama_dir
    args = parse("--triton-url", "h:8001", "--tokenizer", tok)
    assert plan_from_args(args).remote and isinstance(build_backend(args, None), TritonBackendClient)
    args = parse("--triton-url", "h:8001", "--triton-url", "dns://svc:8001", "--tokenizer", tok,
                 "--affinity-load-factor", "3", "--no-prefix-affinity")
    rs = build_backend(args, None)
    assert isinstance(rs, ReplicaSet) and rs.policy == RoutingPolicy(False, 3.0, 4)
    args = parse("--triton-urls-file", "urls.txt", "--tokenizer", tok)
    assert plan_from_args(args).remote and isinstance(build_backend(args, None), ReplicaSet)
    for bad in (["--affinity-load-factor", "0.5"], ["--triton-metrics-url", "x", "--triton-metrics-url", "y"],
                ["--affinity-load-slack", "-1"]):
        with pytest.raises(ValueError):
            validate_replica_flags(parse("--triton-url", "h:8001", *bad))
    with pytest.raises(ValueError):
        validate_replica_flags(parse("--triton-url", "no-port"))
