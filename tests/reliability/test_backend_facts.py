"""A gateway in front of remote backends (--triton-url, as in docs/deployment.md's tritonserver example,
deploy/k8s and docker-compose) learns the context length and the served model's name from
the backend itself, with a describe request the model answers (seam.tensors.DESCRIBE_PARAM).

Before, without --max-model-len the gateway did not know the context, so chat without
max_tokens got the engine's 16-token default instead of "up to the context"; and /v1/models
showed Triton's model name, `llm`.
"""
from __future__ import annotations

import os

import pytest

from kvserve.frontend.cli.host_process import HostProcess, free_port, host_command
from tests.conftest import tiny_model
from tests.reliability.served import REPO, Served, start_served

BACKEND_MAX_MODEL_LEN = 96
BACKEND_NAME = "tiny-remote"


@pytest.fixture(scope="module")
def remote() -> Served:
    env = {**os.environ, "KVSERVE_MODEL": tiny_model("llama"), "KVSERVE_MAX_MODEL_LEN": str(BACKEND_MAX_MODEL_LEN),
           "KVSERVE_SERVED_MODEL_NAME": BACKEND_NAME, "OTEL_TRACES_EXPORTER": "none", "PYTHONUNBUFFERED": "1"}
    host = HostProcess(host_command(str(REPO / "model_repository"), free_port(), free_port()), env)
    address = host.start(180)
    try:
        served = start_served(["--triton-url", address.grpc, "--tokenizer", tiny_model("llama")])
        try:
            yield served
        finally:
            served.stop(timeout=60)
    finally:
        host.stop()


def test_the_gateway_names_the_model_as_the_backend_does(remote: Served) -> None:
    models = remote.get("/v1/models").json()["data"]
    assert [m["id"] for m in models] == [BACKEND_NAME], models
    assert models[0]["max_model_len"] == BACKEND_MAX_MODEL_LEN


def test_chat_without_max_tokens_runs_to_the_backends_context(remote: Served) -> None:
    reply = remote.post("/v1/chat/completions", {"ignore_eos": True,  # the default model
                                                 "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status == 200, reply.body[:300]
    usage = reply.json()["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == BACKEND_MAX_MODEL_LEN, usage
    # And the gateway refuses an over-long request itself, naming the backend's limit.
    reply = remote.post("/v1/completions", {"prompt": [5] * 90, "max_tokens": 10})
    assert reply.status == 400 and str(BACKEND_MAX_MODEL_LEN) in reply.json()["error"]["message"]
