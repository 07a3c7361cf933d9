"""Locust users for OpenAI-compatible streaming endpoints (kvserve, vLLM, ...).

Besides locust's own row for each HTTP call (time to response headers), every
streamed request reports custom request events, so locust's tables, charts and
CSVs show LLM latencies directly:
    request_type "TTFT"  time to the first content chunk
    request_type "ITL"   one event per gap between content chunks
    request_type "E2E"   whole stream, response_length = output tokens
Failures (HTTP errors, error events mid-stream, empty streams) are locust
failures on the HTTP row.

Headless runs (the package must be importable: `pip install -e .`):
    # plain: 16 users, 4 spawned/s, 2 minutes, both endpoints
    locust -f loadtests/bench/sustained/locustfile.py --headless --host http://127.0.0.1:8000 \\
        -u 16 -r 4 -t 2m --csv results/steady
    # chat only, with a load shape (steady | ramp | spike) driven by env vars
    KVSERVE_LOAD_SHAPE=ramp KVSERVE_USERS=64 KVSERVE_DURATION=300 \\
        locust -f loadtests/bench/sustained/locustfile.py --headless --host http://127.0.0.1:8000 \\
        --csv results/ramp ChatUser
    KVSERVE_LOAD_SHAPE=spike KVSERVE_USERS=8 KVSERVE_SPIKE_USERS=64 \\
        KVSERVE_SPIKE_AT=30 KVSERVE_SPIKE_LEN=15 KVSERVE_DURATION=120 \\
        locust -f loadtests/bench/sustained/locustfile.py --headless --host http://127.0.0.1:8000

Environment:
    KVSERVE_MODEL          model name (default: first of GET /v1/models)
    KVSERVE_PROMPT_WORDS   words per random prompt (default 256, about as many tokens)
    KVSERVE_MAX_TOKENS     max_tokens per request (default 128)
    KVSERVE_IGNORE_EOS     1 sends ignore_eos: true, for exact output lengths (default 1)
    KVSERVE_THINK_TIME     seconds a user waits between requests (default 0)
    OPENAI_API_KEY         sent as a bearer token when set
    KVSERVE_LOAD_SHAPE     steady | ramp | spike (unset: use -u/-r/-t)
    KVSERVE_USERS, KVSERVE_SPAWN_RATE, KVSERVE_DURATION, KVSERVE_SPIKE_USERS,
    KVSERVE_SPIKE_AT, KVSERVE_SPIKE_LEN   shape parameters (see load_shapes.py)
"""
from __future__ import annotations

import os
import random
import time
from typing import Any

from locust import HttpUser, LoadTestShape, constant, task

from kvserve.loadtests.bench.prompt_builder import WORDS
from kvserve.loadtests.bench.sse import LineSplitter, data_payload, parse_payload
from kvserve.loadtests.bench.sustained.load_shapes import ShapeConfig, selected_shape

PROMPT_WORDS = int(os.environ.get("KVSERVE_PROMPT_WORDS", "256"))
MAX_TOKENS = int(os.environ.get("KVSERVE_MAX_TOKENS", "128"))
IGNORE_EOS = os.environ.get("KVSERVE_IGNORE_EOS", "1") not in ("0", "false", "")
API_KEY = os.environ.get("OPENAI_API_KEY", "")


class _StreamingUser(HttpUser):
    abstract = True
    wait_time = constant(float(os.environ.get("KVSERVE_THINK_TIME", "0")))
    path = ""
    label = ""
    _model: str | None = os.environ.get("KVSERVE_MODEL") or None  # shared by all users

    def on_start(self) -> None:
        if _StreamingUser._model is None:
            with self.client.get("/v1/models", name="/v1/models", headers=self._headers(),
                                 catch_response=True) as resp:
                if resp.status_code == 200 and resp.json().get("data"):
                    _StreamingUser._model = resp.json()["data"][0]["id"]
                    resp.success()
                else:
                    resp.failure(f"cannot list models: HTTP {resp.status_code}")

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"} if API_KEY else {}

    def _prompt(self) -> str:
        # Random words: distinct prompts, so no accidental prefix-cache hits.
        return " ".join(random.choices(WORDS, k=PROMPT_WORDS))

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": _StreamingUser._model or "default",
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if IGNORE_EOS:
            body["ignore_eos"] = True
        return body

    def _fire(self, kind: str, ms: float, length: int = 0) -> None:
        self.environment.events.request.fire(
            request_type=kind, name=self.label, response_time=ms,
            response_length=length, exception=None, context={},
        )

    def _stream(self, body: dict[str, Any]) -> None:
        sent = time.perf_counter()
        stamps: list[float] = []
        output_tokens = 0
        with self.client.post(self.path, json=body, headers=self._headers(), stream=True,
                              catch_response=True, name=self.path) as resp:
            if resp.status_code != 200:
                resp.failure(f"HTTP {resp.status_code}: {resp.text[:200]}")
                return
            splitter = LineSplitter()
            for raw in resp.iter_content(chunk_size=None):
                now = time.perf_counter()
                for line in splitter.feed(raw):
                    payload = data_payload(line)
                    if payload is None:
                        continue
                    event = parse_payload(payload)
                    if event.error:
                        resp.failure(event.error)
                        return
                    if event.text:
                        stamps.append(now)
                    if event.completion_tokens is not None:
                        output_tokens = int(event.completion_tokens)
            if not stamps:
                resp.failure("stream ended without any content")
                return
            resp.success()
        end = time.perf_counter()
        self._fire("TTFT", (stamps[0] - sent) * 1000)
        for a, b in zip(stamps, stamps[1:]):
            self._fire("ITL", (b - a) * 1000)
        self._fire("E2E", (end - sent) * 1000, output_tokens or len(stamps))


class ChatUser(_StreamingUser):
    path = "/v1/chat/completions"
    label = "chat"

    @task
    def chat(self) -> None:
        self._stream({**self._body(), "messages": [{"role": "user", "content": self._prompt()}]})


class CompletionUser(_StreamingUser):
    path = "/v1/completions"
    label = "completions"

    @task
    def complete(self) -> None:
        self._stream({**self._body(), "prompt": self._prompt()})


_shape = selected_shape()
if _shape is not None:
    # Defined only when asked for: locust uses any shape class it finds, which
    # would otherwise override -u/-r/-t on every run.
    class KvserveLoadShape(LoadTestShape):
        config = ShapeConfig.from_env()

        def tick(self):  # type: ignore[override]
            return _shape(self.get_run_time(), self.config)
