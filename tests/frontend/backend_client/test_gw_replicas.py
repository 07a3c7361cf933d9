"""Several backends behind one client, merged metrics, model facts, OpenAPI coverage."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from kvserve.frontend.backend_client.protocol import BackendUnavailable, GenerateRequest
from kvserve.frontend.backend_client.replicas.metrics_merge import merge_exposition
from kvserve.frontend.backend_client.replicas.replica_set import ReplicaSet
from kvserve.frontend.cli.model_info import derive_max_model_len
from kvserve.frontend.http.app import build_app
from kvserve.frontend.http.gateway import Gateway
from kvserve.frontend.http.gateway_config import GatewayConfig
from kvserve.frontend.openai.openapi import openapi_document

from gw_fakes import FakeBackend


def test_engine_control_reaches_every_ready_replica() -> None:
    async def body() -> None:
        a, b = FakeBackend(name="a"), FakeBackend(name="b")
        rs = ReplicaSet([a, b])
        assert await rs.engine_control("reset_prefix_cache") == {"action": "reset_prefix_cache",
                                                                  "forgotten_blocks": 6}  # 3 each, summed
        assert a.engine_actions == b.engine_actions == ["reset_prefix_cache"]
    asyncio.run(body())


def test_least_loaded_replica_gets_the_request_and_failures_take_one_out() -> None:
    async def body() -> None:
        a, b = FakeBackend(name="a"), FakeBackend(name="b")
        rs = ReplicaSet([a, b])
        slow = rs.generate(GenerateRequest("r1", "SLOW", {"n": 1}))
        await slow.__anext__()  # r1 is in flight on a
        assert [d.text async for d in rs.generate(GenerateRequest("r2", "x", {"max_tokens": 1}))] == ["alpha"]
        assert [r.request_id for r in a.requests] == ["r1"] and [r.request_id for r in b.requests] == ["r2"]
        await slow.aclose()
        assert a.cancelled == ["r1"]
        try:
            [d async for d in rs.generate(GenerateRequest("r3", "OFFLINE", {}))]
        except BackendUnavailable:
            pass
        # not started anywhere: tried on each replica once, and each is taken out
        assert a.requests[-1].request_id == b.requests[-1].request_id == "r3"
        assert [r.ready for r in rs.replica_status()] == [False, False]
        assert await rs.ready()  # their health checks pass again
        assert [d.text async for d in rs.generate(GenerateRequest("r4", "x", {"max_tokens": 1}))] == ["alpha"]
        a.is_ready = b.is_ready = False
        assert not await rs.ready()
    asyncio.run(body())


def test_metrics_of_replicas_merge_into_valid_exposition() -> None:
    one = "# HELP kvserve:num_requests_running R.\n# TYPE kvserve:num_requests_running gauge\nkvserve:num_requests_running{model=\"llm\"} 3\n"
    two = one.replace(" 3\n", " 4\n")
    merged = merge_exposition({"h1:8001": one, "h2:8001": two})
    assert merged.count("# TYPE kvserve:num_requests_running") == 1
    samples = [s for fam in text_string_to_metric_families(merged) for s in fam.samples]
    assert {(s.labels["replica"], s.value) for s in samples} == {("h1:8001", 3.0), ("h2:8001", 4.0)}


def test_max_model_len_follows_the_engine_rule(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096}))
    assert derive_max_model_len(tmp_path, None) == 4096
    assert derive_max_model_len(tmp_path, 512) == 512
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"], "max_position_embeddings": 32768,
                                                       "sliding_window": 4096}))
    assert derive_max_model_len(tmp_path, None) == 4096
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "max_position_embeddings": 32768,
                                                       "sliding_window": 4096, "use_sliding_window": False}))
    assert derive_max_model_len(tmp_path, None) == 32768
    assert derive_max_model_len(tmp_path / "missing", None) is None


def test_openapi_documents_every_route_with_its_methods() -> None:
    app = build_app(Gateway(GatewayConfig(served_model_names=["m"]), FakeBackend()))
    routes = {(r.resource.canonical, r.method.lower()) for r in app.router.routes()}
    doc = openapi_document("1", secured=True, vocab_size=300)
    documented = {(path, method) for path, item in doc["paths"].items() for method in item if method != "parameters"}
    assert routes == documented
    assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/health"]["get"]
    schemas = doc["components"]["schemas"]
    assert schemas["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] == 299
    for ref in _refs(doc):
        assert ref.split("/")[-1] in schemas


def _refs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref":
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)
