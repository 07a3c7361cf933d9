"""POST /v1/completions and POST /v1/chat/completions: validate, build the
prompt(s), hand them to `generation.respond`. `prepare_chat` and `subrequests` are also the
first steps of the Responses and Messages routes, which arrive here as chat requests."""
from __future__ import annotations

import time
import uuid
from typing import Any

from aiohttp import web

from kvserve.frontend.backend_client import GenerateRequest, backend_traceparent
from kvserve.frontend.http import (GATEWAY, Gateway, effective_cache_salt, read_json_body, request_span,
                                   request_tenant, response_id)
from kvserve.frontend.openai.api_errors import ApiError, bad_request
from kvserve.frontend.openai.api_requests import ChatRequest, CompletionRequest, parse_chat, parse_completion
from kvserve.frontend.openai.beam.beam_search import BeamSearchBackend
from kvserve.frontend.openai.chat_template import ChatTemplateError, render_chat
from kvserve.frontend.openai.generation import Call, respond
from kvserve.frontend.openai.tools import ToolRequest, render_messages
from kvserve.seam.limits import DEFAULT_MAX_TOKENS, kept_prompt_tokens


def _context_error(prompt_len: int, max_tokens: int, limit: int, param: str) -> ApiError:
    return ApiError(
        400,
        f"context_length_exceeded: this model's maximum context length is {limit} tokens; "
        f"the request has {prompt_len} prompt tokens and asks for {max_tokens} more",
        param=param,
        code="context_length_exceeded",
    )


def _check_context(gateway: Gateway, prompt_ids: list[int], sampling: dict, param: str, *, fill_default: bool) -> None:
    """Check prompt + max_tokens against --max-model-len when the gateway knows it
    (the engine checks too; this only saves a round trip). For chat, a missing
    max_tokens means "up to the context limit", as vLLM does."""
    limit = gateway.config.max_model_len
    if limit is None:
        return
    # as the engine will cut it; a max_tokens still to be filled in leaves room for one token
    prompt_len = kept_prompt_tokens(len(prompt_ids), sampling.get("truncate_prompt_tokens"),
                                    sampling.get("max_tokens"), limit)
    if "max_tokens" not in sampling:
        if not fill_default:
            return
        if prompt_len >= limit:
            raise _context_error(prompt_len, 1, limit, param)
        sampling["max_tokens"] = limit - prompt_len
    elif prompt_len + sampling["max_tokens"] > limit:
        raise _context_error(prompt_len, sampling["max_tokens"], limit, param)


async def _prompt_ids(gateway: Gateway, req: CompletionRequest) -> list[list[int]]:
    """Each prompt's token ids as the engine reads them (return_token_ids): a text is tokenized
    with the same tokenizer files and special tokens the engine uses, and cut as it cuts them."""
    tok = gateway.require_tokenizer()
    out = []
    for prompt in req.prompts:
        ids = prompt if isinstance(prompt, list) else await tok.encode_async(prompt, add_special_tokens=True)
        limit = gateway.config.max_model_len
        if limit is not None:  # a completion without max_tokens gets the engine's default
            ids = ids[-kept_prompt_tokens(len(ids), req.sampling.get("truncate_prompt_tokens"),
                                          req.sampling.get("max_tokens", DEFAULT_MAX_TOKENS), limit):]
        out.append(ids)
    return out


def _apply_tenant_salt(gateway: Gateway, sampling: dict) -> None:
    """Prefix-cache isolation: the engine sees a salt derived from the
    authenticated tenant and the client's own `cache_salt`, never the client's
    value alone, so one tenant cannot reuse (or time) another's cached prefixes."""
    salt = effective_cache_salt(gateway.config.cache_salt_secret, request_tenant(), sampling.get("cache_salt"))
    if salt is None:
        sampling.pop("cache_salt", None)
    else:
        sampling["cache_salt"] = salt


async def _prediction_ids(gateway: Gateway, req: ChatRequest) -> list[int] | None:
    """The predicted output as the engine tokenizes it (usage compares the reply's tokens to it)."""
    text = req.sampling.get("prediction")
    if text is None:
        return None
    return await gateway.require_tokenizer().encode_async(text, add_special_tokens=False)


def _beam_search(gateway: Gateway, req: CompletionRequest | ChatRequest) -> BeamSearchBackend | None:
    """The call's backend when it asks for vLLM's beam search (run here, over the engine)."""
    if req.beam_length_penalty is None:
        return None
    return BeamSearchBackend(gateway.backend, gateway.require_tokenizer(), req.beam_length_penalty)


# Triton request ids are always fresh uuids: the engine keys its requests by id, so an id the
# client chose (X-Request-Id, `request_id`) names only the response (response_id) and the logs.
def subrequests(request: web.Request, rid: str, prompts: list, sampling: dict, stream: bool,
                lora_name: str | None = None) -> list[GenerateRequest]:
    """`lora_name`: the adapter the call's `model` names (Gateway.lora_of), None for the base model."""
    traceparent = backend_traceparent(request_span())
    return [
        GenerateRequest(request_id=f"{rid}-{i}", prompt=p, sampling=sampling, stream=stream, traceparent=traceparent,
                        lora_name=lora_name)
        for i, p in enumerate(prompts)
    ]


async def create_completion(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    req: CompletionRequest = parse_completion(body, gateway.vocab_size)
    model = gateway.resolve_model(req.model)
    _apply_tenant_salt(gateway, req.sampling)
    echo_texts = None
    if req.echo:
        echo_texts = [
            p if isinstance(p, str) else gateway.require_tokenizer().decode(p, skip_special_tokens=False)
            for p in req.prompts
        ]
    if req.add_special_tokens is False:  # the engine adds them to a text: it gets the text's ids instead
        tok = gateway.require_tokenizer()
        req.prompts = [await tok.encode_async(p, add_special_tokens=False) if isinstance(p, str) else p
                       for p in req.prompts]
    for prompt in req.prompts:
        if isinstance(prompt, list):
            _check_context(gateway, prompt, req.sampling, "prompt", fill_default=False)
    await gateway.ensure_ready()
    rid = f"cmpl-{uuid.uuid4().hex}"
    call = Call(response_id("cmpl", rid, req.request_id), int(time.time()), model, req.n, chat=False,
                logprobs=req.logprobs is not None, include_usage=req.include_usage, echo_texts=echo_texts,
                constraint_param=req.constraint_param, prompt_logprobs=req.prompt_logprobs is not None,
                echo_only=req.echo_only,
                prompt_token_ids=await _prompt_ids(gateway, req) if req.return_token_ids else None,
                tokens_as_ids=req.tokens_as_ids, backend=_beam_search(gateway, req),
                continuous_usage=req.continuous_usage)
    subs = subrequests(request, rid, req.prompts, req.sampling, req.stream, gateway.lora_of(model))
    return await respond(request, gateway, call, subs, req.stream)


async def chat_prompt_ids(gateway: Gateway, messages: list[dict], add_generation_prompt: bool,
                          tools: ToolRequest | None = None, param: str = "messages", *,
                          continue_final_message: bool = False, template_kwargs: dict[str, Any] | None = None,
                          add_special_tokens: bool = False) -> list[int]:
    tok = gateway.require_tokenizer()
    template = gateway.chat_template()
    # tool_choice "none": the tools stay out of the prompt (no call could be read back anyway).
    messages, extra = render_messages(messages, tools.tools if tools is not None and tools.parses_calls else None,
                                      template)
    try:
        text = render_chat(
            template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok.bos_token,
            eos_token=tok.eos_token,
            extra={**(template_kwargs or {}), **extra},
            continue_final_message=continue_final_message,
        )
    except ChatTemplateError as exc:
        raise bad_request(str(exc), param=param) from None
    ids = await tok.encode_async(text, add_special_tokens=add_special_tokens)
    if not ids:
        raise bad_request("the rendered conversation is empty", param=param)
    return ids


async def chat_request_ids(gateway: Gateway, req: ChatRequest, param: str = "messages",
                           messages: list[dict] | None = None) -> list[int]:
    """A validated chat request's conversation (or `messages` in its place) rendered and tokenized
    as the request's own settings say."""
    return await chat_prompt_ids(gateway, req.messages if messages is None else messages, req.add_generation_prompt,
                                 req.tools, param, continue_final_message=req.continue_final_message,
                                 template_kwargs=req.template_kwargs, add_special_tokens=bool(req.add_special_tokens))


async def prepare_chat(gateway: Gateway, req: ChatRequest, param: str = "messages",
                       ids: list[int] | None = None) -> tuple[str, list[int]]:
    """(the served model name, the prompt's token ids) of a validated chat request: the tenant's
    cache salt applied, the conversation rendered with the chat template (unless the caller did:
    `ids`), the context checked, the backend ready. `param` names the field the conversation came
    from in errors."""
    model = gateway.resolve_model(req.model)
    _apply_tenant_salt(gateway, req.sampling)
    if ids is None:
        ids = await chat_request_ids(gateway, req, param)
    _check_context(gateway, ids, req.sampling, param, fill_default=True)
    await gateway.ensure_ready()
    return model, ids


async def create_chat_completion(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    body = await read_json_body(request, gateway.config.max_request_body_bytes, gateway.config.body_timeout)
    req: ChatRequest = parse_chat(body, gateway.vocab_size, gateway.config.tools)
    model, ids = await prepare_chat(gateway, req)
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    final = req.messages[-1]
    # vLLM's chat echo heads the reply with the final message when it is the reply's own role
    echo_texts = [final["content"]] if req.echo and final["role"] == "assistant" else None
    call = Call(response_id("chatcmpl", rid, req.request_id), int(time.time()), model, req.n, chat=True,
                logprobs=req.logprobs, include_usage=req.include_usage, echo_texts=echo_texts,
                constraint_param=req.constraint_param, tools=req.tools, prompt_logprobs=req.prompt_logprobs is not None,
                prompt_token_ids=[ids] if req.return_token_ids else None, tokens_as_ids=req.tokens_as_ids,
                backend=_beam_search(gateway, req), continuous_usage=req.continuous_usage,
                prediction_ids=await _prediction_ids(gateway, req))
    subs = subrequests(request, rid, [ids], req.sampling, req.stream, gateway.lora_of(model))
    return await respond(request, gateway, call, subs, req.stream)
