"""Render chat messages into one prompt string with the model's Jinja template,
the way Hugging Face's `apply_chat_template` does (same variables, sandboxed).
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

class ChatTemplateError(ValueError):
    """The template refused the conversation (e.g. roles must alternate)."""


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False) -> str:
    # HF templates call tojson with these keyword arguments; jinja's built-in lacks some.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def compile_template(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def resolve_template_arg(value: str | None) -> str | None:
    """`--chat-template` takes a file path or the template text itself (as vLLM)."""
    if value is None:
        return None
    candidate = Path(value)
    try:
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8")
    except OSError:
        pass
    if "{" not in value:
        raise FileNotFoundError(f"--chat-template: {value} is neither a file nor a Jinja template")
    return value


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    extra: dict[str, Any] | None = None,
    continue_final_message: bool = False,
) -> str:
    """`extra`: more template variables (`tools`, for a template that renders them).
    `continue_final_message`: the text ends with the final message's content, left open."""
    try:
        text = compile_template(template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **(extra or {}),
        )
    except ChatTemplateError:
        raise
    except Exception as exc:  # a template is user code: any failure is a bad conversation, not a 500
        raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc
    return end_at_final_message(text, messages[-1]["content"]) if continue_final_message else text


def end_at_final_message(text: str, final: str) -> str:
    """The rendered conversation cut right after the final message's content (what the template
    closes it with, an end-of-turn token, goes), as transformers' continue_final_message cuts it.
    Templates often strip a message: its trailing whitespace stays only where it was rendered."""
    stripped = final.strip()
    at = text.rfind(stripped) if stripped else -1
    if at < 0:
        raise ChatTemplateError("continue_final_message: the chat template does not render the final "
                                "message's text as given, so there is no place to continue it from")
    tail = final.lstrip()
    end = at + (len(tail) if text.startswith(tail, at) else len(stripped))
    return text[:end]
