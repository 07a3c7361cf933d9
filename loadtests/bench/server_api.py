"""The small, non-streaming parts of the server's API the benchmark relies on:
model discovery (GET /v1/models), token counting (POST /tokenize, the route
vLLM-compatible servers expose at the root, not under /v1) and Prometheus
metrics (GET /metrics)."""
from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from typing import Iterable

import aiohttp


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def first_model(session: aiohttp.ClientSession, base_url: str, headers: dict[str, str]) -> str:
    """`--model` default: the first model the server lists, as vLLM bench does."""
    async with session.get(f"{base_url}/v1/models", headers=headers) as resp:
        if resp.status != 200:
            raise RuntimeError(f"GET {base_url}/v1/models returned HTTP {resp.status}; pass --model")
        body = await resp.json()
    models = body.get("data") or []
    if not models:
        raise RuntimeError(f"{base_url}/v1/models lists no model; pass --model")
    return str(models[0]["id"])


@dataclass(slots=True)
class ServerTokenCounter:
    """Counts tokens with the server's own tokenizer (and, for chat, its chat
    template), so prompt lengths match what the server will report in usage."""

    session: aiohttp.ClientSession
    base_url: str
    model: str
    chat: bool
    headers: dict[str, str]

    def _body(self, text: str) -> dict[str, object]:
        if self.chat:
            return {"model": self.model, "messages": [{"role": "user", "content": text}]}
        return {"model": self.model, "prompt": text}

    async def count(self, text: str) -> int:
        async with self.session.post(
            f"{self.base_url}/tokenize", json=self._body(text), headers=self.headers
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"POST /tokenize returned HTTP {resp.status}: {(await resp.text())[:200]}")
            body = await resp.json()
        if "count" in body:
            return int(body["count"])
        return len(body["tokens"])


async def probe_tokenize(
    session: aiohttp.ClientSession, base_url: str, model: str, chat: bool, headers: dict[str, str]
) -> ServerTokenCounter | None:
    """A counter if the server offers /tokenize, else None (we then estimate)."""
    counter = ServerTokenCounter(session, base_url, model, chat, headers)
    try:
        async with session.post(f"{base_url}/tokenize", json=counter._body("hello"), headers=headers) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, ValueError):
        return None
    if not isinstance(body, dict) or not ("count" in body or "tokens" in body):
        return None
    return counter


def metric_sums(metrics_url: str, names: Iterable[str]) -> dict[str, float]:
    """Each named counter or gauge summed over its label sets, from one scrape of a
    Prometheus text page; names the page does not have are left out."""
    wanted = tuple(names)
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    out: dict[str, float] = {}
    for line in lines:
        for name in wanted:
            if line.startswith((name + "{", name + " ")):
                out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out
