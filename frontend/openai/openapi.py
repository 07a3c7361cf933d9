"""OpenAPI 3.0 description of the gateway's routes, with the same limits the
validators enforce (so a schema-driven fuzzer's valid inputs are accepted and
its invalid ones get 4xx). Built as data at request time: the vocabulary size
bounds token ids and the security section depends on --api-key.
"""
from __future__ import annotations

from typing import Any

from kvserve.frontend.openai.anthropic.messages_openapi import messages_schemas
from kvserve.frontend.openai.api_requests import CHAT_ROLES, MAX_PROMPTS
from kvserve.frontend.openai.responses_api.responses_openapi import responses_schemas
from kvserve.frontend.openai.scoring.score_openapi import RERANK_PATHS, SCORE_PATHS, score_schemas
from kvserve.frontend.openai.tools import MAX_TOOLS
from kvserve.seam.limits import (
    MAX_ALLOWED_TOKEN_IDS, MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_VALUE, MAX_LOGPROBS, MAX_N, MAX_STOP, MAX_STOP_CHARS,
    MAX_PREDICTION_CHARS, MAX_TIMEOUT_S,
)
from kvserve.seam.limits import MAX_EMBEDDING_INPUTS

# Reachable without a key; every other route (this document included) needs one when keys are set.
PUBLIC_PATHS = ("/health", "/metrics", "/version")


def _num(lo: float | None = None, hi: float | None = None, *, exclusive_lo: bool = False, integer: bool = False) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer" if integer else "number", "nullable": True}
    if lo is not None:
        s["minimum"] = lo
        if exclusive_lo:
            s["exclusiveMinimum"] = True
    if hi is not None:
        s["maximum"] = hi
    return s


def _bool() -> dict[str, Any]:
    return {"type": "boolean", "nullable": True}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _sampling_props(token_id: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": {"type": "string", "maxLength": 512, "nullable": True},
        "max_tokens": _num(1, integer=True),
        "min_tokens": _num(0, integer=True),
        "temperature": _num(0, 2),
        "top_p": _num(0, 1, exclusive_lo=True),
        "top_k": _num(-1, integer=True),
        "min_p": _num(0, 1),
        "n": _num(1, MAX_N, integer=True),
        "seed": _num(-(2**63), 2**64 - 1, integer=True),
        "stop": {"nullable": True, "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS},
            {"type": "array", "maxItems": MAX_STOP, "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}},
        ]},
        "stop_token_ids": {"type": "array", "maxItems": MAX_STOP, "items": token_id, "nullable": True},
        "presence_penalty": _num(-2, 2),
        "frequency_penalty": _num(-2, 2),
        "repetition_penalty": _num(0, 2, exclusive_lo=True),
        "ignore_eos": _bool(),
        "logit_bias": {"type": "object", "nullable": True, "maxProperties": MAX_LOGIT_BIAS,
                       "additionalProperties": {"type": "number", "minimum": -MAX_LOGIT_BIAS_VALUE,
                                                 "maximum": MAX_LOGIT_BIAS_VALUE}},
        "user": {"type": "string", "maxLength": 256, "nullable": True},
        "stream": _bool(),
        "stream_options": {"type": "object", "nullable": True, "description": "only with stream: true (a 400 otherwise)",
                           "properties": {"include_usage": _bool(), "continuous_usage_stats": {
                               **_bool(), "description": "vLLM extension, with include_usage: usage so far in "
                                                         "every chunk"}}},
        "response_format": {"type": "object", "nullable": True, "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object", "required": ["schema"], "description": "with type json_schema",
                            "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 64},
                                           "schema": {"type": "object"}, "strict": _bool()}}}},
        **_constraint_props(),
        "cache_salt": {"type": "string", "minLength": 1, "maxLength": 256, "nullable": True,
                       "description": "prefix-cache scope within the caller's tenant"},
        "timeout": {**_num(0, MAX_TIMEOUT_S, exclusive_lo=True),
                    "description": "kvserve extension: seconds; past it the request ends with a timeout error"},
        "include_stop_str_in_output": _bool(),
        "skip_special_tokens": _bool(),
        "prompt_logprobs": {**_num(0, MAX_LOGPROBS, integer=True),
                            "description": "vLLM extension: list each prompt token's logprob and the top k; "
                                           "not with stream"},
        "return_token_ids": {**_bool(), "description": "vLLM extension: the prompt's and each choice's token ids "
                                                       "(streamed: the prompt's in the first chunk, each chunk's own)"},
        "return_tokens_as_token_ids": {**_bool(), "description": "vLLM extension: logprobs name tokens 'token_id:N'"},
        "add_special_tokens": {**_bool(), "description": "vLLM extension: completions default true, chat false"},
        "allowed_token_ids": {"type": "array", "minItems": 1, "maxItems": MAX_ALLOWED_TOKEN_IDS, "items": token_id,
                              "nullable": True, "description": "vLLM extension: sample only among these ids"},
        "bad_words": {"type": "array", "maxItems": MAX_STOP, "nullable": True,
                      "items": {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS, "pattern": "\\S"},
                      "description": "vLLM extension: words never generated"},
        "truncate_prompt_tokens": {**_num(-1, integer=True), "not": {"enum": [0]},
                                   "description": "vLLM extension: read only the prompt's last N tokens "
                                                  "(-1: as many as fit beside max_tokens)"},
        "request_id": _request_id(),
        "use_beam_search": {**_bool(), "description": "vLLM extension: n (at most 10) is the beam width; the choices "
                                                      "are the best n beams. Sampling fields it would ignore are refused"},
        "length_penalty": {"type": "number", "nullable": True,
                           "description": "vLLM extension, with use_beam_search: a beam's summed logprob is divided by "
                                          "its length to this power (default 1)"},
    }


def _request_id() -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "maxLength": 256, "nullable": True,
            "description": "vLLM extension: the response's id after its prefix; an X-Request-Id header wins"}


def _constraint_props() -> dict[str, Any]:
    """vLLM's structured-output fields (see frontend/openai/structured_request.py): one per request."""
    text = {"type": "string", "minLength": 1, "nullable": True}
    json_or_text = {"nullable": True, "oneOf": [{"type": "object"}, {"type": "string", "minLength": 1}]}
    choice = {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}, "nullable": True}
    return {
        "structured_outputs": {
            "type": "object", "nullable": True, "minProperties": 1, "additionalProperties": False,
            "description": "exactly one constraint: json (a JSON schema), json_object, regex, choice, "
                           "grammar (xgrammar EBNF) or structural_tag (xgrammar's)",
            "properties": {"json": json_or_text, "json_object": _bool(), "regex": text, "choice": choice,
                           "grammar": text, "structural_tag": json_or_text}},
        "guided_json": json_or_text, "guided_regex": text, "guided_choice": choice, "guided_grammar": text,
    }


def _tool_props() -> dict[str, Any]:
    function = {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "description": {"type": "string", "nullable": True},
        "parameters": {"type": "object", "description": "a JSON schema; default: no parameters"}}}
    return {
        "tools": {"type": "array", "maxItems": MAX_TOOLS, "nullable": True, "items": {
            "type": "object", "required": ["type", "function"],
            "properties": {"type": {"type": "string", "enum": ["function"]}, "function": function}}},
        "tool_choice": {"nullable": True, "oneOf": [
            {"type": "string", "enum": ["none", "auto", "required"]},
            {"type": "object", "required": ["type", "function"], "properties": {
                "type": {"type": "string", "enum": ["function"]},
                "function": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}},
        ]},
        "parallel_tool_calls": _bool(),
    }


def _schemas(vocab_size: int | None) -> dict[str, Any]:
    token_id: dict[str, Any] = {"type": "integer", "minimum": 0}
    if vocab_size is not None:
        token_id["maximum"] = vocab_size - 1
    ids = {"type": "array", "minItems": 1, "items": token_id}
    # The embedding model's vocabulary is its own (the gateway does not know its size).
    embed_ids = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
    text_part = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
    tool_call = {"type": "object", "required": ["function"], "properties": {
        "id": {"type": "string"}, "type": {"type": "string", "enum": ["function"]},
        "function": {"type": "object", "required": ["name", "arguments"], "properties": {
            "name": {"type": "string"}, "arguments": {"type": "string", "description": "JSON text"}}}}}
    message = {"type": "object", "required": ["role"], "properties": {  # an assistant message may omit content
        "role": {"type": "string", "enum": sorted(CHAT_ROLES)},
        "content": {"nullable": True, "description": "null only for an assistant message",
                    "oneOf": [{"type": "string"}, {"type": "array", "items": text_part}]},
        "name": {"type": "string", "nullable": True},
        "tool_calls": {"type": "array", "nullable": True, "description": "assistant messages only",
                       "items": tool_call},
        "tool_call_id": {"type": "string", "nullable": True, "description": "with role tool"},
    }}
    usage = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"], "properties": {
        "prompt_tokens": {"type": "integer"}, "completion_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"},
        "prompt_tokens_details": {"type": "object", "properties": {"cached_tokens": {"type": "integer"}}},
    }}
    finish = {"type": "string", "nullable": True}
    # vLLM's: per prompt token, null (the first) or {token id: {logprob, rank, decoded_token}}
    prompt_logprobs = {"type": "array", "nullable": True, "items": {
        "type": "object", "nullable": True, "additionalProperties": {"type": "object", "properties": {
            "logprob": {"type": "number"}, "rank": {"type": "integer"}, "decoded_token": {"type": "string"}}}}}
    return {
        "CompletionRequest": {"type": "object", "required": ["prompt"], "properties": {
            **_sampling_props(token_id),
            "prompt": {"oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": {"type": "string", "minLength": 1}},
                ids,
                {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": ids},
            ]},
            "echo": {**_bool(), "description": "with logprobs, the prompt's tokens are listed too; "
                                               "with max_tokens 0, the prompt alone comes back"},
            "logprobs": _num(0, MAX_LOGPROBS, integer=True),
            "max_tokens": {**_num(0, integer=True), "description": "0 only with echo"},
        }},
        "ChatCompletionRequest": {"type": "object", "required": ["messages"], "properties": {
            **_sampling_props(token_id),
            "messages": {"type": "array", "minItems": 1, "items": message},
            "max_completion_tokens": _num(1, integer=True),
            "logprobs": _bool(),
            "top_logprobs": _num(0, MAX_LOGPROBS, integer=True),
            "add_generation_prompt": {**_bool(), "description": "vLLM extension (default true)"},
            "continue_final_message": {**_bool(), "description": "vLLM extension: continue the final message "
                                                                 "(a prefilled reply); not with add_generation_prompt"},
            "chat_template_kwargs": {"type": "object", "nullable": True,
                                     "description": "vLLM extension: more chat template variables"},
            "echo": {**_bool(), "description": "vLLM extension: a final assistant message heads the reply"},
            "prediction": {"type": "object", "nullable": True, "required": ["type", "content"], "properties": {
                "type": {"type": "string", "enum": ["content"]},
                "content": {"oneOf": [{"type": "string", "maxLength": MAX_PREDICTION_CHARS},
                                      {"type": "array", "items": {"type": "object", "required": ["type", "text"]}}]}},
                "description": "Predicted Outputs: text the reply likely repeats; speculative decoding proposes "
                               "from it (never changes the reply)"},
            "documents": {"type": "array", "nullable": True, "items": {"type": "object", "additionalProperties": {"type": "string"}},
                          "description": "vLLM extension: passages for a RAG chat template"},
            **_tool_props(),
        }},
        "Completion": {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["text_completion"]},
            "created": {"type": "integer"}, "model": {"type": "string"}, "usage": usage,
            "choices": {"type": "array", "items": {"type": "object", "required": ["index", "text", "finish_reason"], "properties": {
                "index": {"type": "integer"}, "text": {"type": "string"}, "finish_reason": finish,
                "logprobs": {"type": "object", "nullable": True},
                "prompt_logprobs": prompt_logprobs}}},
        }},
        "ChatCompletion": {"type": "object", "required": ["id", "object", "created", "model", "choices"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["chat.completion"]},
            "created": {"type": "integer"}, "model": {"type": "string"}, "usage": usage,
            "prompt_logprobs": prompt_logprobs,
            "choices": {"type": "array", "items": {"type": "object", "required": ["index", "message", "finish_reason"], "properties": {
                "index": {"type": "integer"}, "finish_reason": finish,
                "message": {"type": "object", "properties": {"role": {"type": "string"}, "content": {"type": "string", "nullable": True},
                                                              "tool_calls": {"type": "array", "items": tool_call}}},
                "logprobs": {"type": "object", "nullable": True}}}},
        }},
        "EmbeddingRequest": {"type": "object", "required": ["input"], "properties": {
            "model": {"type": "string", "maxLength": 512, "nullable": True},
            "input": {"oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": {"type": "string", "minLength": 1}},
                embed_ids,
                {"type": "array", "minItems": 1, "maxItems": MAX_EMBEDDING_INPUTS, "items": embed_ids},
            ], "description": "texts or token ids of the embedding model; each at most its max_model_len tokens"},
            "encoding_format": {"type": "string", "enum": ["float", "base64"], "nullable": True,
                                "description": "base64: the little-endian float32 bytes of each vector"},
            "dimensions": {**_num(1, integer=True), "description": "Matryoshka models only; refused otherwise"},
            "user": {"type": "string", "maxLength": 256, "nullable": True},
            "truncate_prompt_tokens": {**_num(-1, integer=True),
                                       "description": "vLLM extension: keep the first N tokens (-1: the model's limit); 0 is refused"},
            "normalize": {**_bool(), "description": "vLLM extension: L2-normalise (default: as the model's files say)"},
            "request_id": _request_id(),
        }},
        "EmbeddingList": {"type": "object", "required": ["object", "data", "model", "usage"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string", "enum": ["list"]}, "created": {"type": "integer"},
            "model": {"type": "string"},
            "data": {"type": "array", "items": {"type": "object", "required": ["object", "index", "embedding"], "properties": {
                "object": {"type": "string", "enum": ["embedding"]}, "index": {"type": "integer"},
                "embedding": {"oneOf": [{"type": "array", "items": {"type": "number"}}, {"type": "string"}]}}}},
            "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"], "properties": {
                "prompt_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}},
        }},
        "Model": {"type": "object", "required": ["id", "object"], "properties": {
            "id": {"type": "string"}, "object": {"type": "string"}, "created": {"type": "integer"},
            "owned_by": {"type": "string"}, "root": {"type": "string"}, "max_model_len": {"type": "integer", "nullable": True}}},
        "ModelList": {"type": "object", "required": ["object", "data"], "properties": {
            "object": {"type": "string"}, "data": {"type": "array", "items": _ref("Model")}}},
        "TokenizeRequest": {"type": "object", "anyOf": [{"required": ["prompt"]}, {"required": ["messages"]}], "properties": {
            "model": {"type": "string", "nullable": True}, "prompt": {"type": "string"},
            "messages": {"type": "array", "minItems": 1, "items": message, "nullable": True, "description": "wins over prompt"},
            "add_special_tokens": _bool(), "add_generation_prompt": _bool(), "return_token_strs": _bool(),
            "continue_final_message": _bool(), "chat_template_kwargs": {"type": "object", "nullable": True}}},
        "TokenizeResponse": {"type": "object", "required": ["count", "tokens"], "properties": {
            "count": {"type": "integer"}, "max_model_len": {"type": "integer", "nullable": True},
            "tokens": {"type": "array", "items": {"type": "integer"}},
            "token_strs": {"type": "array", "items": {"type": "string"}}}},
        "DetokenizeRequest": {"type": "object", "required": ["tokens"], "properties": {
            "model": {"type": "string", "nullable": True}, "tokens": {"type": "array", "items": token_id}}},
        "DetokenizeResponse": {"type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
        **messages_schemas(),
        **responses_schemas(),
        **score_schemas(),
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["message", "type"], "properties": {
                "message": {"type": "string"}, "type": {"type": "string"},
                "param": {"type": "string", "nullable": True}, "code": {"type": "string", "nullable": True}}}}},
    }


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": _ref("Error")}}}


def _post(summary: str, request: str, response: str, *, stream: bool, protected: bool,
          backend: bool = False) -> dict[str, Any]:
    ok: dict[str, Any] = {"application/json": {"schema": _ref(response)}}
    if stream:
        # OpenAPI 3.0: the schema describes one event; `data` is a JSON chunk, an error object or [DONE].
        ok["text/event-stream"] = {"schema": {"type": "object", "required": ["data"], "properties": {
            "data": {"type": "string"}, "event": {"type": "string"}}}}
    responses = {"200": {"description": "OK", "content": ok}, "400": _error("invalid request"),
                 "404": _error("unknown model"), "413": _error("body too large"),
                 "415": _error("body is not JSON"), "408": _error("the body did not arrive within --body-timeout")}
    if stream or backend:
        responses["503"] = _error("backend not ready, overloaded or shutting down")
        responses["500"] = _error("engine failure")
    if stream:
        responses["408"] = _error("the body did not arrive in time, or the request's own timeout passed")
    if protected:
        responses["401"] = _error("missing or wrong API key")
    return {"post": {"summary": summary, "requestBody": {"required": True, "content": {
        "application/json": {"schema": _ref(request)}}}, "responses": responses}}


def _stored_response(protected: bool) -> dict[str, Any]:
    """GET and DELETE of one stored response: another API key's id is not found (404)."""
    parameters = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]

    def op(summary: str, schema: str) -> dict[str, Any]:
        responses: dict[str, Any] = {"200": {"description": "OK", "content": {"application/json": {"schema": _ref(schema)}}},
                                     "404": _error("no stored response with this id (for this API key)")}
        if protected:
            responses["401"] = _error("missing or wrong API key")
        return {"summary": summary, "parameters": parameters, "responses": responses}

    return {"get": op("A stored response", "Response"), "delete": op("Delete a stored response", "DeletedResponse")}


def openapi_document(version: str, *, secured: bool, vocab_size: int | None) -> dict[str, Any]:
    def get(summary: str, schema: dict[str, Any] | None, *extra: tuple[str, dict[str, Any]], protected: bool = False) -> dict[str, Any]:
        content = {"application/json": {"schema": schema}} if schema else {"text/plain": {"schema": {"type": "string"}}}
        responses: dict[str, Any] = {"200": {"description": "OK", "content": content}, **dict(extra)}
        if protected and secured:
            responses["401"] = _error("missing or wrong API key")
        return {"get": {"summary": summary, "responses": responses}}

    protected = secured

    paths = {
        "/v1/completions": _post("Create a text completion", "CompletionRequest", "Completion", stream=True, protected=secured),
        "/v1/chat/completions": _post("Create a chat completion", "ChatCompletionRequest", "ChatCompletion", stream=True, protected=secured),
        "/v1/embeddings": _post("Create embeddings (needs an embedding model: --embedding-model)", "EmbeddingRequest",
                                "EmbeddingList", stream=False, protected=secured, backend=True),
        **{path: _post("Score text pairs by the cosine of their embeddings (vLLM's score API; needs an "
                       "embedding model)", "ScoreRequest", "ScoreList", stream=False, protected=secured, backend=True)
           for path in SCORE_PATHS},
        **{path: _post("Rank documents against a query by the cosine of their embeddings (vLLM's, Jina's and "
                       "Cohere's rerank; needs an embedding model)", "RerankRequest", "RerankResponse",
                       stream=False, protected=secured, backend=True)
           for path in RERANK_PATHS},
        "/v1/responses": _post("Create a response (OpenAI's Responses API; streamed as typed events)",
                               "ResponsesRequest", "Response", stream=True, protected=secured),
        "/v1/responses/{response_id}": _stored_response(secured),
        "/v1/messages": _post("Create a message (Anthropic's Messages API; errors in Anthropic's shape, "
                              "x-api-key accepted)", "MessagesRequest", "Message", stream=True, protected=secured),
        "/v1/messages/count_tokens": _post("Count a message's prompt tokens (Anthropic's count_tokens)",
                                           "CountTokensRequest", "TokenCount", stream=False, protected=secured),
        "/tokenize": _post("Tokenize a prompt or a conversation", "TokenizeRequest", "TokenizeResponse", stream=False, protected=secured),
        "/detokenize": _post("Turn token ids back into text", "DetokenizeRequest", "DetokenizeResponse", stream=False, protected=secured),
        "/v1/models": get("List served models", _ref("ModelList"), protected=True),
        "/v1/models/{model}": {"get": {**get("Describe one model", _ref("Model"), ("404", _error("unknown model")), protected=True)["get"],
                                       "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]}},
        "/health": get("200 when the backend is ready", {"type": "object"}, ("503", _error("backend not ready"))),
        "/metrics": get("Prometheus metrics of the gateway and its backends", None),
        "/version": get("Server version", {"type": "object", "properties": {"version": {"type": "string"}}}),
        "/openapi.json": get("This document", {"type": "object"}, protected=protected),
    }
    doc: dict[str, Any] = {
        "openapi": "3.0.3",
        "info": {"title": "kvserve OpenAI-compatible API", "version": version},
        "paths": paths,
        "components": {"schemas": _schemas(vocab_size)},
    }
    for item in paths.values():  # the DNS-rebinding check applies everywhere (host_policy.py)
        for op in item.values():
            op["responses"]["421"] = _error("the Host header names a server this one does not answer for")
    if secured:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        for path, item in paths.items():
            if path not in PUBLIC_PATHS:
                for op in item.values():
                    op["security"] = [{"bearer": []}]
    return doc
