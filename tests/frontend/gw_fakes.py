"""Test doubles for the gateway: an in-memory `BackendClient`, a tiny trained
BPE tokenizer, and a gateway server running on its own event-loop thread (so
tests can use the official synchronous `openai` client against it)."""
from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kvserve.frontend.backend_client.protocol import (
    BackendFailed,
    BackendRejected,
    BackendUnavailable,
    ChoiceDelta,
    GenerateRequest,
    TokenLogprob,
    TopLogprob,
)
from kvserve.frontend.http.app import build_app, start_app
from kvserve.frontend.http.gateway import Gateway
from kvserve.frontend.http.gateway_config import GatewayConfig
from kvserve.seam.error_wire import ErrorKind
from kvserve.seam.tokenizer import ModelTokenizer

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
SENTENCES = [
    "the quick brown fox jumps over the lazy dog",
    "a paged kv cache hands out blocks on demand",
    "continuous batching lets finished requests leave at once",
    "alpha beta gamma delta epsilon zeta eta theta iota kappa",
    "hello world, how are you today? fine thanks.",
]
SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' and loop.first %}{{ raise_exception('conversation must not start with assistant') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer_dir(path: Path, *, template: str | None = CHAT_TEMPLATE) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(SENTENCES, trainer=trainer)
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}}
    if template is not None:
        config["chat_template"] = template
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@dataclass
class FakeBackend:
    """Generates WORDS deterministically; choice i starts at word i.

    Prompts steer it: "REJECT" -> validation error, "TOOLONG" -> context
    length error, "CRASH" -> fails after two tokens, "SLOW" -> 20 ms a token
    and endless until cancelled (max_tokens ignored).
    """

    name: str = "fake"
    is_ready: bool = True
    token_delay_s: float = 0.0
    requests: list[GenerateRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    cancel_event: threading.Event = field(default_factory=threading.Event)
    decode: object = None  # set to the tokenizer's decode so token prompts can steer too
    max_tokens_cap: int | None = None  # bound generation when a fuzzer asks for 2**31 tokens
    engine_actions: list[str] = field(default_factory=list)  # engine control requests, in order

    async def ready(self) -> bool:
        return self.is_ready

    async def metrics_text(self) -> str:
        return "# HELP kvserve:num_requests_running Running.\n# TYPE kvserve:num_requests_running gauge\nkvserve:num_requests_running 0.0\n"

    async def close(self) -> None:
        pass

    async def describe(self):
        return None  # the gateway keeps what its flags say

    async def engine_control(self, action: str) -> dict:
        self.engine_actions.append(action)
        return {"action": action, "forgotten_blocks": 3}

    async def generate(self, request: GenerateRequest) -> AsyncIterator[ChoiceDelta]:
        self.requests.append(request)
        if isinstance(request.prompt, str):
            prompt_text = request.prompt
        else:
            prompt_text = self.decode(request.prompt, skip_special_tokens=False) if self.decode else ""
        prompt_tokens = len(prompt_text.split()) if isinstance(request.prompt, str) else len(request.prompt)
        s = request.sampling
        if "REJECT" in prompt_text:
            raise BackendRejected("temperature: must be in [0.0, 100.0], got 999", param="temperature")
        if "TOOLONG" in prompt_text:
            raise BackendRejected("context_length_exceeded: prompt too long", kind=ErrorKind.CONTEXT_LENGTH,
                                  param="prompt")
        if "OFFLINE" in prompt_text:
            raise BackendUnavailable("backend fake: UNAVAILABLE")
        slow = "SLOW" in prompt_text
        n, max_tokens = s.get("n", 1), s.get("max_tokens", 16)
        if self.max_tokens_cap is not None:
            max_tokens = min(max_tokens, self.max_tokens_cap)
        stops: list[str] = s.get("stop", [])
        complete = False
        try:
            texts = ["" for _ in range(n)]
            step = 0
            live = set(range(n))
            while live:
                for i in sorted(live):
                    if "CRASH" in prompt_text and step == 2:
                        raise BackendFailed("engine exploded")
                    token = (" " if step else "") + WORDS[(i + step) % len(WORDS)]
                    before = len(texts[i])
                    texts[i] += token
                    finish = None
                    emitted = token
                    hit = next((st for st in stops if st in texts[i]), None)
                    if hit is not None:
                        cut = texts[i].index(hit)
                        emitted = texts[i][before:cut] if cut > before else ""
                        finish = "stop"
                    elif step + 1 >= max_tokens and not slow:
                        finish = "length"
                    yield ChoiceDelta(
                        index=i,
                        text=emitted,
                        token_ids=[100 + (i + step) % len(WORDS)],
                        finish_reason=finish,
                        prompt_tokens=prompt_tokens,
                        completion_tokens=step + 1,
                        cached_tokens=1 if prompt_tokens > 1 else 0,
                        logprobs=self._logprobs(s, token, i + step) if "logprobs" in s else None,
                    )
                    if finish:
                        live.discard(i)
                step += 1
                if slow or self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s or 0.02)
                else:
                    await asyncio.sleep(0)
            complete = True
        finally:
            (self.finished if complete else self.cancelled).append(request.request_id)
            if not complete:
                self.cancel_event.set()

    @staticmethod
    def _logprobs(sampling: dict, token: str, k: int) -> list[TokenLogprob]:
        # Numbers only, as the engine sends them: the gateway renders the token texts.
        tops = [TopLogprob(200 + j, -1.0 - j) for j in range(sampling["logprobs"])]
        return [TokenLogprob(100 + k % len(WORDS), -0.25, tops)]


class GatewayServer:
    """A gateway on 127.0.0.1:<free port>, served from a background event loop."""

    def __init__(self, backend: FakeBackend, config: GatewayConfig, tokenizer_dir: Path | None) -> None:
        self.backend = backend
        self.config = config
        self.tokenizer = ModelTokenizer.from_folder(tokenizer_dir) if tokenizer_dir else None
        if self.tokenizer is not None:
            backend.decode = self.tokenizer.decode
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._runner = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> GatewayServer:
        self._thread.start()
        self.gateway = Gateway(self.config, self.backend, self.tokenizer)
        fut = asyncio.run_coroutine_threadsafe(start_app(build_app(self.gateway), "127.0.0.1", 0), self.loop)
        self._runner, self.port = fut.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)

    def wait_cancelled(self, count: int = 1, timeout_s: float = 2.0) -> float:
        """Seconds until the fake saw `count` cancellations (fails after timeout)."""
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if len(self.backend.cancelled) >= count:
                return time.monotonic() - start
            time.sleep(0.01)
        raise AssertionError(f"backend saw {len(self.backend.cancelled)} cancellations, expected {count}")


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


def http(method: str, url: str, *, json_body: object | None = None, data: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 10.0) -> Reply:
    """A plain HTTP call (stdlib only) for what the openai client cannot send."""
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    hdrs = dict(headers or {})
    if json_body is not None:
        data = json.dumps(json_body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    try:
        conn.request(method, parts.path + (f"?{parts.query}" if parts.query else ""), body=data, headers=hdrs)
        resp = conn.getresponse()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
    finally:
        conn.close()


def get(url: str, **kw) -> Reply:
    return http("GET", url, **kw)


def post(url: str, json_body: object | None = None, **kw) -> Reply:
    return http("POST", url, json_body=json_body, **kw)


def delete(url: str, **kw) -> Reply:
    return http("DELETE", url, **kw)
