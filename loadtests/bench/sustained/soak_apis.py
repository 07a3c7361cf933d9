"""The soak's Responses and Anthropic Messages requests, and the checks on what comes back.

A Responses request may continue an earlier answer (`previous_response_id`: a short conversation
held in the gateway's store), or ask not to be stored. Every answer that completes, whole or
streamed, is checked against the API's own rules, not just for a 200:
- a whole Response: `status` completed or incomplete (incomplete exactly when `max_output_tokens`
  cut it off), a message whose text is there, usage that adds up;
- a Responses stream: `response.created` and `response.in_progress` first, `sequence_number`
  counting from 0 with no gap, every event's `type` its SSE name, text deltas only inside an open
  message, and a last `response.completed` / `response.incomplete` whose output text is the deltas
  joined;
- a whole Message: `type` message, role assistant, text blocks, a known `stop_reason`, usage;
- a Messages stream: `message_start` first, content blocks started, filled and stopped in index
  order, one `message_delta` with the stop reason and usage, `message_stop` last.
In both, `max_tokens` (or `max_output_tokens`) as the stop reason means exactly that many tokens
(a natural end may come at the limit too: an end-of-sequence token as the last one allowed).
A stored Response is sometimes read back (GET must return what the POST did) or deleted (a GET
after it must be a 404).
"""
from __future__ import annotations

import json
import random
from collections import deque
from typing import Any

API_KINDS = ("responses", "messages")
_MESSAGE_STOPS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}
CHAIN_TURNS = 3  # a conversation continued this many times starts again (its prompt keeps growing)


class ResponseChains:
    """A client's recent stored Response ids, to continue with `previous_response_id`."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.turns = 0
        self.stored: deque[dict[str, Any]] = deque(maxlen=4)  # whole stored Responses, to read back

    def previous(self, rng: random.Random) -> str | None:
        if self.last is None or self.turns >= CHAIN_TURNS or rng.random() < 0.5:
            return None
        return self.last

    def answered(self, response: dict[str, Any], continued: bool, stored: bool) -> None:
        if not stored:
            return
        self.turns = self.turns + 1 if continued else 0
        self.last = response.get("id")
        self.stored.append(response)

    def forget(self, response: dict[str, Any]) -> None:
        """It was deleted: not read back, nor continued."""
        self.stored.remove(response)
        if self.last == response.get("id"):
            self.last, self.turns = None, 0


def api_request(kind: str, rng: random.Random, model: str, prompt: str, max_tokens: int, streaming: bool,
                chains: ResponseChains) -> tuple[str, dict[str, Any]]:
    """(path, body) of one Responses or Messages request."""
    temperature = rng.choice([0.0, 0.7])
    if kind == "messages":
        return "/v1/messages", {"model": model, "max_tokens": max_tokens, "stream": streaming,
                                "temperature": temperature, "messages": [{"role": "user", "content": prompt}]}
    body: dict[str, Any] = {"model": model, "input": prompt, "max_output_tokens": max_tokens, "stream": streaming,
                            "temperature": temperature}
    previous = chains.previous(rng)
    if previous is not None:
        body["previous_response_id"] = previous
    if rng.random() < 0.2:
        body["store"] = False
    return "/v1/responses", body


def token_limit(body: dict[str, Any]) -> int:
    return int(body.get("max_output_tokens") or body["max_tokens"])


# ---- whole answers ------------------------------------------------------------------------------
def response_text(response: dict[str, Any]) -> str:
    return "".join(part.get("text", "") for item in response.get("output") or [] if item.get("type") == "message"
                   for part in item.get("content") or [] if part.get("type") == "output_text")


def check_response(response: dict[str, Any], limit: int) -> str:
    if response.get("object") != "response" or not str(response.get("id", "")).startswith("resp"):
        return f"invalid: not a Response ({str(response)[:120]})"
    status, usage = response.get("status"), response.get("usage") or {}
    if status not in ("completed", "incomplete"):
        return f"invalid: status {status!r}"
    out = usage.get("output_tokens", -1)
    if usage.get("total_tokens") != usage.get("input_tokens", 0) + out or not 0 <= out <= limit:
        return f"invalid: usage {usage} for max_output_tokens {limit}"
    cut = (response.get("incomplete_details") or {}).get("reason") == "max_output_tokens"
    if (status == "incomplete") != cut or (cut and out != limit):
        return f"invalid: status {status} with {out} of {limit} tokens ({response.get('incomplete_details')})"
    if not any(item.get("type") == "message" for item in response.get("output") or []):
        return "invalid: no message in output"
    return "valid"


def check_message(message: dict[str, Any], limit: int) -> str:
    if message.get("type") != "message" or message.get("role") != "assistant":
        return f"invalid: not a Message ({str(message)[:120]})"
    blocks = message.get("content")
    if not isinstance(blocks, list) or any(b.get("type") not in ("text", "tool_use") for b in blocks):
        return f"invalid: content {str(blocks)[:120]}"
    return _stop_and_usage(message.get("stop_reason"), (message.get("usage") or {}).get("output_tokens", -1), limit)


def _stop_and_usage(stop: Any, out: int, limit: int) -> str:
    if stop not in _MESSAGE_STOPS:
        return f"invalid: stop_reason {stop!r}"
    if not 0 <= out <= limit or (stop == "max_tokens" and out != limit):
        return f"invalid: stop_reason {stop} with {out} of {limit} output tokens"
    return "valid"


# ---- streams --------------------------------------------------------------------------------------
class EventStream:
    """Collects `event:` / `data:` frames from SSE lines; `events` holds (name, payload) pairs."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._name: str | None = None

    def add_line(self, raw: bytes) -> str | None:
        """Takes one line; returns the name of the event it completed, if any."""
        line = raw.strip()
        if line.startswith(b"event:"):
            self._name = line[6:].strip().decode()
        elif line.startswith(b"data:"):
            if line[5:].strip() == b"[DONE]":
                return None
            payload = json.loads(line[5:])
            self.events.append((self._name or "", payload))
            self._name = None
            return self.events[-1][0]
        return None


def check_response_stream(events: list[tuple[str, dict[str, Any]]], limit: int) -> str:
    names = [name for name, _ in events]
    if names[:2] != ["response.created", "response.in_progress"]:
        return f"invalid: opens with {names[:2]}"
    for i, (name, payload) in enumerate(events):
        if payload.get("type") != name or payload.get("sequence_number") != i:
            return f"invalid: event {i} is {name} with {payload.get('type')} #{payload.get('sequence_number')}"
    if names[-1] not in ("response.completed", "response.incomplete"):
        return f"invalid: ends with {names[-1]}"
    open_items: set[str] = set()
    text: list[str] = []
    for name, payload in events:
        if name == "response.output_item.added":
            open_items.add(payload["item"]["id"])
        elif name == "response.output_item.done":
            open_items.discard(payload["item"]["id"])
        elif name == "response.output_text.delta":
            if payload.get("item_id") not in open_items:
                return f"invalid: a text delta outside an open item ({payload.get('item_id')})"
            text.append(payload["delta"])
    final = events[-1][1]["response"]
    verdict = check_response(final, limit)
    if verdict != "valid":
        return verdict
    if response_text(final) != "".join(text):
        return f"invalid: the deltas join to {''.join(text)[:60]!r}, the Response says {response_text(final)[:60]!r}"
    return "valid"


def check_message_stream(events: list[tuple[str, dict[str, Any]]], limit: int) -> str:
    events = [(name, payload) for name, payload in events if name != "ping"]
    names = [name for name, _ in events]
    if not names or names[0] != "message_start" or names[-1] != "message_stop":
        return f"invalid: {names[:1]} ... {names[-1:]}"
    if any(payload.get("type") != name for name, payload in events):
        return "invalid: an event whose type is not its name"
    next_index, open_index, delta = 0, None, None
    for name, payload in events[1:-1]:
        if name == "content_block_start":
            if open_index is not None or payload.get("index") != next_index:
                return f"invalid: block {payload.get('index')} started at {next_index} (open {open_index})"
            open_index, next_index = next_index, next_index + 1
        elif name in ("content_block_delta", "content_block_stop"):
            if payload.get("index") != open_index:
                return f"invalid: {name} for block {payload.get('index')}, open {open_index}"
            if name == "content_block_stop":
                open_index = None
        elif name == "message_delta":
            if delta is not None or open_index is not None:
                return "invalid: a second message_delta, or one inside a block"
            delta = payload
        else:
            return f"invalid: unexpected {name}"
    if delta is None:
        return "invalid: no message_delta"
    return _stop_and_usage((delta.get("delta") or {}).get("stop_reason"),
                           (delta.get("usage") or {}).get("output_tokens", -1), limit)


def check_stream(kind: str, events: list[tuple[str, dict[str, Any]]], limit: int) -> str:
    return (check_response_stream if kind == "responses" else check_message_stream)(events, limit)


def check_whole(kind: str, answer: dict[str, Any], limit: int) -> str:
    return (check_response if kind == "responses" else check_message)(answer, limit)


# ---- the store --------------------------------------------------------------------------------------
async def read_back(session: Any, url: str, headers: dict[str, str], chains: ResponseChains,
                    rng: random.Random) -> str:
    """GET a stored Response (it must be what the POST returned), or DELETE it (a GET then 404s)."""
    if not chains.stored:
        return "valid"
    stored = chains.stored[rng.randrange(len(chains.stored))]
    where = f"{url.rstrip('/')}/v1/responses/{stored['id']}"
    if rng.random() < 0.25:
        async with session.delete(where, headers=headers) as resp:
            await resp.read()
            if resp.status != 200:
                return f"invalid: DELETE {stored['id']} answered {resp.status}"
        chains.forget(stored)
        async with session.get(where, headers=headers) as resp:
            await resp.read()
            return "valid" if resp.status == 404 else f"invalid: GET after DELETE answered {resp.status}"
    async with session.get(where, headers=headers) as resp:
        data = await resp.read()
        if resp.status != 200:
            return f"invalid: GET {stored['id']} answered {resp.status}"
    got = json.loads(data)
    return "valid" if got == stored else f"invalid: GET {stored['id']} differs from the POST's answer"
