"""`kvserve serve --tensor-parallel-size 3` on the real default model (SmolLM2-135M-Instruct: 9 query
heads, 3 KV heads) answers what TP=1 answers (greedy), through the gateway and the embedded host;
a worker killed mid-stream ends the stream with an error and the whole server exits non-zero,
with no rank left running."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.serve_process import kvserve_serve

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?", "Write a haiku about autumn."]
WORKER = "kvserve.backend.worker.parallel.worker"


def _serve(extra: list[str], check_exit: bool = True):
    return kvserve_serve(["--port", "0", "--max-num-seqs", "4", "--max-model-len", "1024", "--num-kv-blocks", "256", "--log-format", "console",
                          *extra], timeout_s=400, check_exit=check_exit)


def _client(line: str):
    return openai.OpenAI(base_url=f"{line.split()[3]}/v1", api_key="unused", max_retries=0, timeout=300)


def _answers(client) -> list[str]:
    return [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], temperature=0,
                                           max_tokens=48).choices[0].message.content for q in QUESTIONS]


def _workers() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and WORKER in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_tp3_answers_equal_tp1(real_model_path):
    with _serve([]) as (_, line):
        expected = _answers(_client(line))
    with _serve(["--tensor-parallel-size", "3"]) as (_, line):
        assert len(_workers()) == 2
        assert _answers(_client(line)) == expected
    assert not _workers()


def test_a_worker_killed_mid_stream_takes_the_server_down(real_model_path):
    with _serve(["--tensor-parallel-size", "3"], check_exit=False) as (proc, line):
        stream = _client(line).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Tell me a long story."}], stream=True,
            max_tokens=400, temperature=0)
        chunks = iter(stream)
        next(chunks)
        os.kill(_workers()[0], signal.SIGKILL)
        with pytest.raises(openai.APIError):
            for _ in chunks:
                pass
        assert proc.wait(timeout=60) != 0
        deadline = time.monotonic() + 10
        while _workers() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _workers(), "a rank is left running"
