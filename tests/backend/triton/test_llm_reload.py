"""The llm model unloaded and loaded again in one embedded host (tritonserver's explicit model
control, RepositoryModelUnload / RepositoryModelLoad): the engine stops with its model, a new one
starts in the same process and serves the same greedy tokens."""
from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.backend.triton.test_llm_model import _inputs, _stream
from tests.conftest import tiny_model
from tests.utils.processes import run_host


def _greedy(client, url: str) -> list[int]:
    chunks, finals, error = _stream(url, _inputs(params={"max_tokens": 8, "temperature": 0, "ignore_eos": True}))
    if error is not None:
        raise error
    assert finals == 1
    return [t for _, ids, _ in chunks for t in ids]


def test_llm_unloads_and_loads_again_in_the_same_host():
    env = {"KVSERVE_MODEL": tiny_model("llama"), "KVSERVE_MAX_MODEL_LEN": "128", "KVSERVE_NUM_KV_BLOCKS": "64"}
    with run_host(env) as host:
        client = grpcclient.InferenceServerClient(host.grpc_url)
        first = _greedy(client, host.grpc_url)
        assert len(first) == 8
        client.unload_model("llm")
        assert not client.is_model_ready("llm")
        with pytest.raises(InferenceServerException):
            _greedy(client, host.grpc_url)
        index = {m.name: (m.version, m.state, m.reason) for m in client.get_model_repository_index().models}
        assert index["llm"] == ("1", "UNAVAILABLE", "unloaded")
        client.load_model("llm")
        assert client.is_model_ready("llm") and _greedy(client, host.grpc_url) == first
        client.load_model("llm")  # a reload: the new engine serves once it is ready, the old one stops
        assert _greedy(client, host.grpc_url) == first
        client.close()
        assert host.proc.poll() is None
