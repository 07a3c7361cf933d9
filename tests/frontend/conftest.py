from __future__ import annotations

from pathlib import Path

import openai
import pytest

from gw_fakes import FakeBackend, GatewayServer, make_tokenizer_dir
from kvserve.frontend.http.gateway_config import GatewayConfig

API_KEY = "sk-test-key"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tokenizer_dir(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def server(tokenizer_dir: Path):
    config = GatewayConfig(served_model_names=["tiny", "tiny-alias"], model_root="/models/tiny", max_request_body_bytes=64 * 1024)
    with GatewayServer(FakeBackend(), config, tokenizer_dir) as srv:
        yield srv


@pytest.fixture(scope="module")
def secured(tokenizer_dir: Path):
    config = GatewayConfig(served_model_names=["tiny"], api_key=API_KEY, max_model_len=64)
    with GatewayServer(FakeBackend(), config, tokenizer_dir) as srv:
        yield srv


@pytest.fixture()
def client(server: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=10)
