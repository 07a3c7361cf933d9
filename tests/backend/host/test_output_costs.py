"""What one generated token costs the engine thread, whatever the output holds
(the real llm model in the embedded host, driven over gRPC as the gateway does).

- Detokenization: a run of tokens that never decodes cleanly (a lone byte that is
  not UTF-8, a special token skipped from the text) once kept the decode window
  open, so every step decoded the whole run again: quadratic in the output
  length. Counted here as token ids handed to the tokenizer's decode per token.
- Stop strings: 64 stop strings of 256 characters once cost milliseconds per
  token per sequence, which every request in the batch waited for. Measured as
  the engine thread's CPU time for a batch (busy requests and a neighbour) with
  such stop strings, against the same batch without them: the step time each
  request of the batch waits for.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from host_fixtures import HostThread

from kvserve.seam.tokenizer import ModelTokenizer
from tests.conftest import tiny_model

MODEL_REPOSITORY = Path(__file__).resolve().parents[3] / "model_repository"
LONE_BYTE = 97        # "¡" in the tiny vocabulary: the byte 0xA1, never valid UTF-8 on its own
SPECIAL = 1           # <|im_start|>, skipped from the text by default
LETTER_A = 67         # "a"


@pytest.fixture(scope="module")
def llm_host():
    env = {"KVSERVE_MODEL": tiny_model("llama"), "KVSERVE_MAX_MODEL_LEN": "2048", "KVSERVE_MAX_NUM_SEQS": "16",
           # One torch thread: no OpenMP team to wait at barriers on a busy machine, so the
           # engine thread's CPU time is its own work.
           "KVSERVE_NUM_THREADS": "1"}
    mp = pytest.MonkeyPatch()
    for k, v in env.items():
        mp.setenv(k, v)
    ht = HostThread(MODEL_REPOSITORY)
    yield ht.handle
    ht.stop()
    mp.undo()


def _inputs(prompt: str, params: dict) -> list[grpcclient.InferInput]:
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([prompt.encode()], dtype=np.object_))
    sp = grpcclient.InferInput("sampling_parameters", [1], "BYTES")
    sp.set_data_from_numpy(np.array([json.dumps(params).encode()], dtype=np.object_))
    return [text, sp]


def _stream_many(url: str, requests: dict[str, dict], timeout: float = 300.0) -> dict[str, list[tuple[float, int]]]:
    """Run requests on one stream; per request, (arrival time, number of new token ids) of each response."""
    got: dict[str, list[tuple[float, int]]] = {rid: [] for rid in requests}
    finals: queue.Queue = queue.Queue()

    def on_result(result, error) -> None:
        if error is not None:
            finals.put(error)
            return
        resp = result.get_response()
        if resp.outputs:
            got[resp.id].append((time.monotonic(), len(result.as_numpy("output_ids"))))
        if resp.parameters["triton_final_response"].bool_param:
            finals.put(resp.id)

    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=on_result)
    try:
        for rid, params in requests.items():
            client.async_stream_infer("llm", _inputs("Once upon a time", params), request_id=rid,
                                      enable_empty_final_response=True)
        for _ in requests:
            done = finals.get(timeout=timeout)
            assert isinstance(done, str), done
    finally:
        client.stop_stream()
        client.close()
    return got


@pytest.mark.parametrize("forced", [LONE_BYTE, SPECIAL], ids=["lone-byte", "special-token"])
def test_decode_work_per_token_is_bounded_whatever_the_output(llm_host, monkeypatch, forced):
    decoded = {"ids": 0}
    lock = threading.Lock()
    real_decode = ModelTokenizer.decode

    def counting_decode(self, ids, skip_special_tokens=True):
        with lock:
            decoded["ids"] += len(ids)
        return real_decode(self, ids, skip_special_tokens)

    monkeypatch.setattr(ModelTokenizer, "decode", counting_decode)
    n = 600
    got = _stream_many(llm_host.grpc_url, {"r": {"max_tokens": n, "ignore_eos": True, "temperature": 0,
                                                 "logit_bias": {str(forced): 100}}})
    assert sum(k for _, k in got["r"]) == n
    # A bounded window decodes a few dozen ids per token; one left open decodes ~n/2 on average.
    assert decoded["ids"] / n < 100, decoded["ids"] / n


def _engine_cpu_s() -> float:
    """CPU time of the engine thread so far: what every request in a batch waits for each step."""
    engine = next(t for t in threading.enumerate() if t.name == "kvserve-engine")
    return time.clock_gettime(time.pthread_getcpuclockid(engine.ident))


def test_long_stop_strings_do_not_slow_the_neighbours(llm_host):
    # The output is "aaaa...": the last stop string keeps 255 characters held back, the other
    # 63 never match; every token then checks all of them against the held text.
    stops = [chr(0x100 + i) * 256 for i in range(63)] + ["a" * 255 + "b"]
    forced = {"max_tokens": 300, "ignore_eos": True, "temperature": 0, "logit_bias": {str(LETTER_A): 100}}

    def engine_cpu(with_stops: bool) -> float:
        reqs = {f"busy{i}": dict(forced, **({"stop": stops} if with_stops else {})) for i in range(6)}
        reqs["neighbour"] = {"max_tokens": 300, "ignore_eos": True, "temperature": 0}
        before = _engine_cpu_s()
        got = _stream_many(llm_host.grpc_url, reqs)
        assert all(sum(k for _, k in got[rid]) == 300 for rid in reqs)
        return _engine_cpu_s() - before

    engine_cpu(True)  # warm up (and build the stop automaton once)
    plain, stopped = engine_cpu(False), engine_cpu(True)
    # Wall-clock gaps on a shared machine swing by more than the effect; the engine thread's
    # CPU time over the same 300 steps does not. Before: 6-8x (ms per token per sequence).
    assert stopped < 2 * plain, (stopped, plain)
