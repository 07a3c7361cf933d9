"""Chat template rendering and tokenizer files."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.frontend.openai.chat_template import (ChatTemplateError, render_chat,
                                                   resolve_template_arg)
from kvserve.seam.tokenizer import ModelTokenizer

from gw_fakes import FakeBackend, GatewayServer, make_tokenizer_dir, post
from kvserve.frontend.http.gateway_config import GatewayConfig


def test_tokenizer_files_give_special_tokens_and_template(tokenizer_dir: Path) -> None:
    tok = ModelTokenizer.from_folder(tokenizer_dir)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>"  # string and AddedToken-dict forms
    assert "im_start" in tok.chat_template
    ids = tok.encode("<|im_start|>user", add_special_tokens=False)
    assert tok.token_strings(ids)[0] == "<|im_start|>"  # special tokens in text stay single tokens
    assert tok.decode(ids, skip_special_tokens=False) == "<|im_start|>user"


def test_render_matches_hf_semantics() -> None:
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}"
    msgs = [{"role": "user", "content": " hi "}]
    assert render_chat(template, msgs, eos_token="</s>") == "[user]hi[assistant]</s>"
    assert render_chat(template, msgs, add_generation_prompt=False) == "[user]hi"


def test_continue_final_message_cuts_after_the_final_content() -> None:
    chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: {"}]
    assert render_chat(chatml, msgs, add_generation_prompt=False, continue_final_message=True) == \
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nSure: {"
    # a trailing space the template renders stays; one it trims cannot be continued from
    spaced = [msgs[0], {"role": "assistant", "content": "The answer is "}]
    assert render_chat(chatml, spaced, add_generation_prompt=False,
                       continue_final_message=True).endswith("assistant\nThe answer is ")
    trimming = "{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}[end]{% endfor %}"
    assert render_chat(trimming, spaced, add_generation_prompt=False,
                       continue_final_message=True) == "[user]hi[end][assistant]The answer is"
    # the final text is found from the end, even where an earlier message holds it too
    echoed = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]
    assert render_chat(trimming, echoed, add_generation_prompt=False, continue_final_message=True) == \
        "[user]x[end][assistant]x"
    with pytest.raises(ChatTemplateError, match="continue_final_message"):
        render_chat("{% for m in messages %}[{{ m.role }}]{% endfor %}", msgs, continue_final_message=True)


def test_template_kwargs_reach_the_template() -> None:
    template = "{% if enable_thinking is defined and not enable_thinking %}/no_think {% endif %}{{ messages[0].content }}"
    msgs = [{"role": "user", "content": "hi"}]
    assert render_chat(template, msgs, extra={"enable_thinking": False}) == "/no_think hi"
    assert render_chat(template, msgs) == "hi"


def test_template_helpers_and_errors() -> None:
    assert render_chat("{{ messages | tojson }}", [{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}]'
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])
    with pytest.raises(ChatTemplateError):
        render_chat("{{ messages[5].content }}", [])  # a broken template is a 400, not a 500
    with pytest.raises(ChatTemplateError):  # sandboxed: no attribute escapes
        render_chat("{{ ''.__class__.__mro__[1].__subclasses__() }}", [])


def test_a_model_without_a_chat_template_refuses_chat_by_name(tmp_path: Path) -> None:
    """A base model (Gemma 3 270M, say) ships no template: chat gets a 400 naming --chat-template,
    completions still work, and the flag's template is then used."""
    bare = make_tokenizer_dir(tmp_path / "bare", template=None)
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with GatewayServer(FakeBackend(), GatewayConfig(served_model_names=["tiny"]), bare) as srv:
        resp = post(f"{srv.url}/v1/chat/completions", chat)
        assert resp.status == 400
        error = json.loads(resp.body)["error"]
        assert "--chat-template" in error["message"] and error["code"] == "chat_template_missing"
        assert error["param"] == "messages"
        assert post(f"{srv.url}/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 2}).status == 200
    given = GatewayConfig(served_model_names=["tiny"], chat_template="{{ messages[0].content }}")
    with GatewayServer(FakeBackend(), given, bare) as srv:
        assert post(f"{srv.url}/v1/chat/completions", chat).status == 200


def test_chat_template_jinja_file_and_list_form(tmp_path: Path) -> None:
    d = make_tokenizer_dir(tmp_path / "a", template=None)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert ModelTokenizer.from_folder(d).chat_template == "D"
    (d / "chat_template.jinja").write_text("J")
    assert ModelTokenizer.from_folder(d).chat_template == "J"


def test_chat_template_flag_takes_file_or_text(tmp_path: Path) -> None:
    f = tmp_path / "t.jinja"
    f.write_text("{{ 1 }}")
    assert resolve_template_arg(str(f)) == "{{ 1 }}"
    assert resolve_template_arg("{% if x %}y{% endif %}") == "{% if x %}y{% endif %}"
    with pytest.raises(FileNotFoundError):
        resolve_template_arg(str(tmp_path / "missing.jinja"))
