"""POST /reset_prefix_cache: mounted only in dev mode (as vLLM's VLLM_SERVER_DEV_MODE), behind
the API key, and handed to the backend as an engine control request."""
from __future__ import annotations

from gw_fakes import FakeBackend, GatewayServer, post
from kvserve.frontend.http.gateway_config import GatewayConfig


def test_without_dev_mode_the_route_is_unknown(server) -> None:
    assert post(f"{server.url}/reset_prefix_cache").status == 404
    assert server.backend.engine_actions == []


def test_in_dev_mode_every_engine_is_asked_and_the_answer_is_vllms(tokenizer_dir) -> None:
    config = GatewayConfig(served_model_names=["tiny"], server_dev_mode=True, api_key="sk-dev")
    with GatewayServer(FakeBackend(), config, tokenizer_dir) as srv:
        assert post(f"{srv.url}/reset_prefix_cache").status == 401  # a key, as every route but the probes
        reply = post(f"{srv.url}/reset_prefix_cache", headers={"Authorization": "Bearer sk-dev"})
        assert (reply.status, reply.body) == (200, b"")
        assert srv.backend.engine_actions == ["reset_prefix_cache"]


def test_a_backend_that_cannot_reset_is_a_clear_error(tokenizer_dir) -> None:
    class OldBackend(FakeBackend):
        engine_control = None  # a backend client without the control request

    config = GatewayConfig(served_model_names=["tiny"], server_dev_mode=True)
    with GatewayServer(OldBackend(), config, tokenizer_dir) as srv:
        reply = post(f"{srv.url}/reset_prefix_cache")
        assert reply.status == 400 and reply.json()["error"]["code"] == "not_supported"
