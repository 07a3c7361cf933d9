"""OpenAI response bodies: whole responses for non-streaming calls and chunks
for SSE. Shapes follow the public API reference: `text_completion`,
`chat.completion`, `chat.completion.chunk`, and `usage` with
`prompt_tokens_details.cached_tokens`.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from kvserve.frontend.backend_client import ChoiceDelta, TokenLogprob
from kvserve.frontend.openai.logprobs_format import (TextOffsets, TokenBytes, TokenText, chat_logprobs,
                                                     completion_logprobs, merge_completion_logprobs)


@dataclass(slots=True)
class ChoiceState:
    """What one output choice accumulated so far."""

    index: int  # OpenAI index: prompt_index * n + choice index
    text: list[str] = field(default_factory=list)
    # completions' text_offset of the next token: the echoed prompt's length plus the characters
    # the tokens listed so far complete, so streamed and unstreamed responses agree even when the
    # engine held text back (an unfinished UTF-8 character, a possible stop string)
    text_offsets: TextOffsets = field(default_factory=TextOffsets)
    finish_reason: str | None = None
    completion_tokens: int = 0
    token_count: int = 0
    completion_lp: list[dict[str, Any]] = field(default_factory=list)
    prompt_lp: dict[str, Any] | None = None  # completions' echo with logprobs: the echoed prompt's part
    prompt_entries: list[TokenLogprob] | None = None  # its prompt's logprobs, when they were asked for
    chat_lp: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None  # chat with tools: what the parser read out of `text`
    token_ids: list[int] | None = None  # return_token_ids: every token id received
    unsent_ids: list[int] = field(default_factory=list)  # streamed: received, not yet in a chunk


@dataclass(slots=True)
class Usage:
    prompt_tokens: dict[int, int] = field(default_factory=dict)  # per prompt: counted once, not per choice
    cached_tokens: dict[int, int] = field(default_factory=dict)
    # OpenAI's completion_tokens_details of a predicted output (compare_prediction); None: no prediction
    prediction: dict[str, int] | None = None

    def observe(self, prompt_index: int, delta: ChoiceDelta) -> None:
        if delta.prompt_tokens:
            self.prompt_tokens[prompt_index] = delta.prompt_tokens
        if delta.cached_tokens:
            self.cached_tokens[prompt_index] = delta.cached_tokens

    def body(self, choices: list[ChoiceState]) -> dict[str, Any]:
        prompt = sum(self.prompt_tokens.values())
        completion = sum(max(c.completion_tokens, c.token_count) for c in choices)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": sum(self.cached_tokens.values())},
            **({} if self.prediction is None else {"completion_tokens_details": dict(self.prediction)}),
        }


async def compare_prediction(usage: Usage, prediction: list[int], choices: list[ChoiceState]) -> None:
    """OpenAI's accepted_prediction_tokens (the prediction's tokens that appear in the reply, in
    order: difflib's matching blocks) and rejected_prediction_tokens (the rest), over every choice.
    On a thread: matching two long sequences of few distinct tokens takes most of a second."""
    outputs = [c.token_ids or [] for c in choices]

    def count() -> dict[str, int]:
        accepted = sum(block.size for out in outputs
                       for block in SequenceMatcher(None, prediction, out, autojunk=False).get_matching_blocks())
        return {"accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": len(prediction) * len(outputs) - accepted}
    usage.prediction = await asyncio.to_thread(count)


def apply_delta(state: ChoiceState, delta: ChoiceDelta, *, chat: bool, token_text: TokenText,
                token_bytes: TokenBytes) -> tuple[Any, str]:
    """Fold a delta into `state`; returns (logprobs for this delta's chunk, its text)."""
    chunk_lp: Any = None
    if delta.logprobs is not None:
        if chat:
            chunk_lp = chat_logprobs(delta.logprobs, token_text, token_bytes)
            state.chat_lp.extend(chunk_lp)
        else:
            chunk_lp = completion_logprobs(delta.logprobs, state.text_offsets, token_text, token_bytes)
            state.completion_lp.append(chunk_lp)
    state.text.append(delta.text)
    state.token_count += len(delta.token_ids)
    if state.token_ids is not None:
        state.token_ids.extend(delta.token_ids)
        state.unsent_ids.extend(delta.token_ids)
    state.completion_tokens = max(state.completion_tokens, delta.completion_tokens)
    if delta.finish_reason:
        state.finish_reason = delta.finish_reason
    return chunk_lp, delta.text


def completion_body(rid: str, created: int, model: str, choices: list[ChoiceState], usage: Usage, logprobs: bool) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "text": "".join(c.text),
                "logprobs": merge_completion_logprobs(
                    ([c.prompt_lp] if c.prompt_lp else []) + c.completion_lp) if logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage.body(choices),
    }


def chat_body(rid: str, created: int, model: str, choices: list[ChoiceState], usage: Usage, logprobs: bool) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c.index,
                "message": _message(c),
                "logprobs": {"content": c.chat_lp} if logprobs else None,
                "finish_reason": c.finish_reason,
            }
            for c in choices
        ],
        "usage": usage.body(choices),
    }


def _message(c: ChoiceState) -> dict[str, Any]:
    text = "".join(c.text)
    if not c.tool_calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": c.tool_calls}


def tool_call_json(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def finish_with_tools(reason: str | None, called: bool) -> str | None:
    """OpenAI's finish_reason "tool_calls" when the model stopped after calling (not on length)."""
    return "tool_calls" if called and reason == "stop" else reason


@dataclass(slots=True)
class ChunkFactory:
    """Builds the chunks of one streamed response (same id/created/model on each)."""

    rid: str
    created: int
    model: str
    include_usage: bool

    def _chunk(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        chunk: dict[str, Any] = {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            chunk["usage"] = None  # as OpenAI: null on every chunk but the last
        return chunk

    def completion(self, index: int, text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
        return self._chunk(
            "text_completion",
            [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}],
        )

    def chat(self, index: int, delta: dict[str, Any], logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
        lp = {"content": logprobs} if logprobs is not None else None
        return self._chunk(
            "chat.completion.chunk",
            [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish_reason}],
        )

    def usage(self, obj: str, usage: dict[str, Any]) -> dict[str, Any]:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": [], "usage": usage}
