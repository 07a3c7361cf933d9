"""Speculative decoding served: the llm model in the embedded host with --speculative-config (as
`kvserve serve` passes it, KVSERVE_SPECULATIVE_CONFIG) streams what offline plain decoding gives,
several tokens a step, and its counters reach Prometheus."""
from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from kvserve.backend import LLM, SamplingParams
from tests.conftest import tiny_model
from tests.utils.processes import run_host

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat"


def _stream(url: str, prompt: str, params: dict) -> list[tuple[str, list[int], str]]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    sampling = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    sampling.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
    q: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: q.put((result, error)))
    client.async_stream_infer("llm", [text, sampling], request_id="s", enable_empty_final_response=True)
    chunks = []
    while True:
        result, err = q.get(timeout=60)
        assert err is None, err
        resp = result.get_response()
        if resp.outputs:
            chunks.append((result.as_numpy("text_output")[0].decode(), result.as_numpy("output_ids").tolist(),
                           result.as_numpy("finish_reason")[0].decode()))
        if resp.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return chunks


@pytest.mark.slow
def test_served_stream_with_speculation_equals_offline_plain_decoding():
    env = {"KVSERVE_MODEL": tiny_model("llama"), "KVSERVE_MAX_MODEL_LEN": "256", "KVSERVE_NUM_KV_BLOCKS": "128",
           "KVSERVE_SPECULATIVE_CONFIG": json.dumps(NGRAM)}
    params = {"max_tokens": 40, "temperature": 0, "ignore_eos": True}
    with run_host(env) as host:
        chunks = _stream(host.grpc_url, PROMPT, params)
        accepted = host.metric("kvserve:spec_decode_num_accepted_tokens_total")
        drafted = host.metric("kvserve:spec_decode_num_draft_tokens_total")
    offline = LLM(model=tiny_model("llama"), max_model_len=256).generate(PROMPT, SamplingParams(**params))[0]
    assert [t for c in chunks for t in c[1]] == offline.outputs[0].token_ids
    assert "".join(c[0] for c in chunks) == offline.outputs[0].text and chunks[-1][2] == "length"
    assert 0 < accepted <= drafted
    assert len(chunks) < len(offline.outputs[0].token_ids)  # some steps streamed several tokens
