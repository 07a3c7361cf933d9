"""`kvserve serve` end to end: the gateway process, the embedded host child and
the engine, driven by the official openai client."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from tests.serve_process import kvserve_serve

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("kvserve.backend.host") is None
    or not (REPO / "model_repository" / "llm" / "1" / "model.py").is_file(),
    reason="needs the embedded host and model_repository/llm/1/model.py",
)
openai = pytest.importorskip("openai")
aiohttp = pytest.importorskip("aiohttp")

API_KEY = "sk-e2e"
MODEL = "tiny-llama"


class Served:
    def __init__(self, proc: subprocess.Popen, url: str) -> None:
        self.proc, self.url = proc, url

    def client(self, key: str = API_KEY):
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=60)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def metric(self, name: str) -> float:
        """Sum over the series of a backend metric in the gateway's /metrics."""
        _, text = self.get("/metrics")
        values = [float(m.group(2)) for m in re.finditer(rf"^{re.escape(name)}(\{{[^}}]*\}})? (\S+)$", text, re.M)]
        assert values, f"{name} not in /metrics"
        return sum(values)


@pytest.fixture(scope="module")
def served(llama_dir: str):
    args = ["--model", llama_dir, "--port", "0", "--served-model-name", MODEL, "--api-key", API_KEY,
            "--max-num-seqs", "48", "--num-kv-blocks", "1024", "--log-format", "console", "--server-dev-mode"]
    with kvserve_serve(args, timeout_s=240) as (proc, line):
        yield Served(proc, line.split()[3])


def test_models_and_health(served: Served) -> None:
    assert [m.id for m in served.client().models.list().data] == [MODEL]
    assert served.get("/health")[0] == 200


def test_reset_prefix_cache_makes_the_next_request_compute_its_prefix_again(served: Served) -> None:
    client = served.client()
    prompt = "The cache keeps the blocks of this prompt for the next request that shares them. " * 6

    def cached_tokens() -> int:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=2).usage.prompt_tokens_details.cached_tokens

    cached_tokens()
    assert cached_tokens() > 0
    req = urllib.request.Request(served.url + "/reset_prefix_cache", data=b"", method="POST",
                                 headers={"Authorization": f"Bearer {API_KEY}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert (resp.status, resp.read()) == (200, b"")
    assert cached_tokens() == 0


def test_beam_search_equals_transformers_beam_search(served: Served, llama_dir: str) -> None:
    """vLLM's use_beam_search, against transformers' generate(num_beams=...) on the same weights:
    with no end-of-sequence and no length penalty both keep the best beams by summed logprob."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    prompt = [1, 57, 301, 12, 88]
    body = {"model": MODEL, "prompt": prompt, "n": 3, "max_tokens": 6, "use_beam_search": True, "ignore_eos": True,
            "length_penalty": 0.0, "return_token_ids": True}
    out = served.post("/v1/completions", body)
    ours = [c["token_ids"] for c in out["choices"]]
    model = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), num_beams=3, num_return_sequences=3, max_new_tokens=6,
                             min_new_tokens=6, do_sample=False, length_penalty=0.0, pad_token_id=0)
    assert ours == [seq[len(prompt):].tolist() for seq in ref]
    assert [c["finish_reason"] for c in out["choices"]] == ["length"] * 3 and out["usage"]["completion_tokens"] == 18


def test_wrong_key_is_rejected(served: Served) -> None:
    with pytest.raises(openai.AuthenticationError):
        served.client("sk-wrong").completions.create(model=MODEL, prompt="hi", max_tokens=2)


def test_too_long_prompt_is_bad_request(served: Served) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        served.client().completions.create(model=MODEL, prompt="hello " * 5000, max_tokens=2)
    assert info.value.body["code"] == "context_length_exceeded"


def test_sampling_extensions_reach_the_engine_and_its_refusals_the_client(served: Served) -> None:
    client = served.client()
    with pytest.raises(openai.BadRequestError) as info:  # this server schedules first come, first served
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body={"priority": 2})
    assert info.value.body["param"] == "priority" and "--scheduling-policy priority" in info.value.body["message"]
    out = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0,
                                    extra_body={"allowed_token_ids": [40, 41], "ignore_eos": True,
                                                "return_token_ids": True, "truncate_prompt_tokens": 2})
    assert set(out.model_dump()["choices"][0]["token_ids"]) <= {40, 41} and out.usage.prompt_tokens == 2
    assert client.completions.create(model=MODEL, prompt="still serving", max_tokens=2).usage.completion_tokens


def test_chat_non_streaming_and_usage_matches_tokens(served: Served) -> None:
    messages = [{"role": "user", "content": "Tell me a story"}]
    out = served.client().chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                                  logprobs=True, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.message.role == "assistant"
    assert out.usage.completion_tokens == 12 == len(choice.logprobs.content)
    prompt = served.post("/tokenize", {"messages": messages})
    assert out.usage.prompt_tokens == prompt["count"]
    assert out.usage.total_tokens == out.usage.prompt_tokens + 12


def test_completion_usage_matches_tokens(served: Served) -> None:
    out = served.client().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=7, temperature=0,
                                             extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 7
    assert out.usage.prompt_tokens == served.post("/tokenize", {"prompt": "Once upon a time"})["count"]


def test_streamed_text_equals_non_streamed_text_greedy(served: Served) -> None:
    client = served.client()
    kwargs = dict(model=MODEL, max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt="The capital of France is", **kwargs).choices[0].text
    parts = client.completions.create(prompt="The capital of France is", stream=True, **kwargs)
    assert "".join(c.choices[0].text for c in parts) == whole
    messages = [{"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(messages=messages, **kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(messages=messages, stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole


def test_n2_streaming_with_usage(served: Served) -> None:
    chunks = list(served.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=5, temperature=1.0, seed=3,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    *content, usage = chunks
    assert usage.choices == [] and usage.usage.completion_tokens == 10
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in content if c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "length"}


def test_stop_string(served: Served) -> None:
    client = served.client()
    base = client.completions.create(model=MODEL, prompt="Once", max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = base.strip()[3:6] if len(base.strip()) >= 6 else base.strip()[:1]
    assert stop, base
    out = client.completions.create(model=MODEL, prompt="Once", max_tokens=16, temperature=0, stop=[stop],
                                    extra_body={"ignore_eos": True}).choices[0]
    assert out.finish_reason == "stop" and stop not in out.text
    assert base.startswith(out.text)


async def _drop_after_chunks(served: Served, count: int, chunks: int) -> float:
    """Open `count` streams, read `chunks` events on each, then drop them all at
    once; returns the engine's running-request count just before the drop."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1500, "stream": True, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {API_KEY}"}
    reached = 0
    all_reached, drop = asyncio.Event(), asyncio.Event()
    async with aiohttp.ClientSession() as session:
        async def one() -> None:
            nonlocal reached
            resp = await session.post(f"{served.url}/v1/completions", json=body, headers=headers)
            seen = 0
            while seen < chunks:
                line = await resp.content.readline()
                seen += line.startswith(b"data: ")
            reached += 1
            if reached == count:
                all_reached.set()
            await drop.wait()
            resp.close()  # drop the connection mid-stream

        tasks = [asyncio.create_task(one()) for _ in range(count)]
        await asyncio.wait_for(all_reached.wait(), 60)
        running = await asyncio.to_thread(served.metric, "kvserve:num_requests_running")
        drop.set()
        await asyncio.gather(*tasks)
    return running


def test_disconnected_streams_free_the_engine(served: Served) -> None:
    running = asyncio.run(_drop_after_chunks(served, count=32, chunks=3))
    assert running > 0  # the engine was busy with them when they went away
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        running = served.metric("kvserve:num_requests_running")
        usage = served.metric("kvserve:kv_cache_usage_perc")
        if running == 0 and usage == 0:
            break
        time.sleep(0.05)
    assert (running, usage) == (0, 0)
