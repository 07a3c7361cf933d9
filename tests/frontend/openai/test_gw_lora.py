"""The gateway's LoRA side against an in-memory backend that serves adapters: a request's `model`
reaches the backend as the adapter's name, an unknown adapter is 404 model_not_found in each
route's own error shape, /v1/models lists the backend's adapters, and the load/unload routes
exist only with --allow-runtime-lora-updating, need the API key, and give vLLM's answers."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import AsyncIterator

import openai
import pytest

from gw_fakes import FakeBackend, GatewayServer, get, post
from kvserve.frontend.backend_client import LoRAControl
from kvserve.frontend.backend_client.replicas.replica_set import ReplicaSet
from kvserve.frontend.backend_client.protocol import BackendRejected, ChoiceDelta, GenerateRequest, LoRAAdapterInfo
from kvserve.frontend.http.gateway_config import GatewayConfig
from kvserve.seam.error_wire import ErrorKind

KEY = "sk-lora"


@dataclass
class LoRABackend(FakeBackend):
    """FakeBackend that knows adapters by name, as the Triton model does."""

    adapters: dict[str, str] = field(default_factory=lambda: {"sql": "/adapters/sql"})
    controls: list[tuple] = field(default_factory=list)

    async def lora_control(self, action: str, lora_name: str | None = None,
                           lora_path: str | None = None) -> list[LoRAAdapterInfo]:
        self.controls.append((action, lora_name, lora_path))
        if action == "load":
            if lora_name in self.adapters:
                raise BackendRejected(f"lora_name: the LoRA adapter {lora_name!r} is already loaded",
                                      param="lora_name")
            if "bad" in (lora_path or ""):
                raise BackendRejected("lora_path: adapter_model.safetensors: rank 99 > max_lora_rank 16",
                                      param="lora_path")
            self.adapters[lora_name] = lora_path
        elif action == "unload":
            if self.adapters.pop(lora_name, None) is None:
                raise BackendRejected("unknown adapter", kind=ErrorKind.NOT_FOUND, param="lora_name")
        return [LoRAAdapterInfo(n, p, "base" if n == "sql" else None) for n, p in self.adapters.items()]

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        if request.lora_name is not None and request.lora_name not in self.adapters:
            raise BackendRejected("model: no such adapter", kind=ErrorKind.NOT_FOUND, param="model")
        async for delta in super().generate(request):
            yield delta


@pytest.fixture(scope="module")
def lora(tokenizer_dir):
    config = GatewayConfig(served_model_names=["base"], model_root="/models/base", enable_lora=True,
                           allow_runtime_lora_updating=True, api_key=KEY)
    with GatewayServer(LoRABackend(), config, tokenizer_dir) as srv:
        yield srv


def _client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=10)


AUTH = {"Authorization": f"Bearer {KEY}"}


def test_the_model_names_the_adapter_the_backend_runs(lora) -> None:
    client = _client(lora)
    out = client.completions.create(model="sql", prompt="hello", max_tokens=2)
    assert out.model == "sql" and lora.backend.requests[-1].lora_name == "sql"
    chat = client.chat.completions.create(model="base", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert chat.model == "base" and lora.backend.requests[-1].lora_name is None
    client.chat.completions.create(model="sql", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert lora.backend.requests[-1].lora_name == "sql"
    client.responses.create(model="sql", input="hi", max_output_tokens=2)
    assert lora.backend.requests[-1].lora_name == "sql"
    reply = post(f"{lora.url}/v1/messages", {"model": "sql", "max_tokens": 2,
                                             "messages": [{"role": "user", "content": "hi"}]}, headers=AUTH)
    assert reply.status == 200 and lora.backend.requests[-1].lora_name == "sql"


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_adapter_is_model_not_found(lora, stream) -> None:
    client = _client(lora)
    with pytest.raises(openai.NotFoundError) as err:
        if stream:
            list(client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=2, stream=True))
        else:
            client.completions.create(model="nope", prompt="hello", max_tokens=2)
    assert err.value.body["code"] == "model_not_found" and err.value.body["param"] == "model"
    messages = post(f"{lora.url}/v1/messages", {"model": "nope", "max_tokens": 2,
                                                "messages": [{"role": "user", "content": "hi"}]}, headers=AUTH)
    assert messages.status == 404 and messages.json()["error"]["type"] == "not_found_error"  # Anthropic's shape
    responses = post(f"{lora.url}/v1/responses", {"model": "nope", "input": "hi"}, headers=AUTH)
    assert responses.status == 404 and responses.json()["error"]["code"] == "model_not_found"


def test_routes_that_do_not_generate_know_adapters_by_the_backends_list(lora) -> None:
    assert post(f"{lora.url}/tokenize", {"model": "sql", "prompt": "hello"}, headers=AUTH).status == 200
    assert post(f"{lora.url}/tokenize", {"model": "nope", "prompt": "hello"}, headers=AUTH).status == 404
    card = get(f"{lora.url}/v1/models/sql", headers=AUTH).json()
    assert (card["id"], card["parent"], card["root"]) == ("sql", "base", "/adapters/sql")
    assert get(f"{lora.url}/v1/models/nope", headers=AUTH).status == 404
    embed = post(f"{lora.url}/v1/embeddings", {"model": "sql", "input": "hi"}, headers=AUTH)
    assert embed.status == 400 and "LoRA adapter" in embed.json()["error"]["message"]


def test_models_lists_adapters_and_runtime_loads(lora) -> None:
    client = _client(lora)
    assert post(f"{lora.url}/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/a/new"}).status == 401
    reply = post(f"{lora.url}/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/a/new"}, headers=AUTH)
    assert reply.status == 200 and "new" in reply.text
    cards = {m.id: m for m in client.models.list().data}
    assert set(cards) == {"base", "sql", "new"}
    assert (cards["new"].parent, cards["new"].root) == ("base", "/a/new")  # no base_model_name: the served model
    assert (cards["sql"].parent, cards["sql"].root) == ("base", "/adapters/sql")
    assert client.completions.create(model="new", prompt="x", max_tokens=1).model == "new"

    again = post(f"{lora.url}/v1/load_lora_adapter", {"lora_name": "new", "lora_path": "/a/new"}, headers=AUTH)
    assert again.status == 400 and "already loaded" in again.json()["error"]["message"]
    bad = post(f"{lora.url}/v1/load_lora_adapter", {"lora_name": "b", "lora_path": "/a/bad"}, headers=AUTH)
    assert bad.status == 400 and "rank 99" in bad.json()["error"]["message"]
    assert bad.json()["error"]["param"] == "lora_path"
    base = post(f"{lora.url}/v1/load_lora_adapter", {"lora_name": "base", "lora_path": "/a/x"}, headers=AUTH)
    assert base.status == 400
    assert post(f"{lora.url}/v1/load_lora_adapter", {"lora_name": "x"}, headers=AUTH).status == 400

    gone = post(f"{lora.url}/v1/unload_lora_adapter", {"lora_name": "new"}, headers=AUTH)
    assert gone.status == 200
    assert "new" not in {m.id for m in client.models.list().data}
    missing = post(f"{lora.url}/v1/unload_lora_adapter", {"lora_name": "new"}, headers=AUTH)
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="new", prompt="x", max_tokens=1)


def test_without_runtime_updating_the_routes_do_not_exist(tokenizer_dir) -> None:
    config = GatewayConfig(served_model_names=["base"], enable_lora=True)
    with GatewayServer(LoRABackend(), config, tokenizer_dir) as srv:
        assert post(f"{srv.url}/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/a"}).status == 404
        assert post(f"{srv.url}/v1/unload_lora_adapter", {"lora_name": "sql"}).status == 404
        assert srv.backend.controls == []


def test_without_lora_an_unknown_model_never_reaches_the_backend(tokenizer_dir) -> None:
    config = GatewayConfig(served_model_names=["base"])  # enable_lora defaults to False
    with GatewayServer(LoRABackend(), config, tokenizer_dir) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0, timeout=10)
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="sql", prompt="x", max_tokens=1)
        assert srv.backend.requests == [] and srv.backend.controls == []
        assert [m.id for m in client.models.list().data] == ["base"]


def test_replicas_load_and_unload_on_each_and_list_from_one() -> None:
    asyncio.run(_replicas())


async def _replicas() -> None:
    a, b = LoRABackend(name="a"), LoRABackend(name="b")
    replicas = ReplicaSet([a, b])
    assert isinstance(replicas, LoRAControl)
    try:
        listed = await replicas.lora_control("load", "new", "/a/new")
        assert {x.name for x in listed} == {"sql", "new"}
        assert a.adapters["new"] == b.adapters["new"] == "/a/new"
        await replicas.lora_control("list")
        assert len(a.controls) + len(b.controls) == 3  # load on both, list on one
        await replicas.lora_control("unload", "new")
        assert "new" not in a.adapters and "new" not in b.adapters
        with pytest.raises(BackendRejected) as err:
            await replicas.lora_control("unload", "new")
        assert err.value.kind is ErrorKind.NOT_FOUND
    finally:
        await replicas.close()
