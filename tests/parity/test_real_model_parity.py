"""On the real default model (SmolLM2-135M-Instruct, GGUF Q4_1 dequantized to float32): kvserve's
greedy tokens equal transformers' (loading the same GGUF with `gguf_file=`) for 16 chat prompts x
64 new tokens, plain (checked position by position against transformers), and identical to that
with chunked prefill, with prefix-cache hits and under preemption; the loaded tensors equal
transformers' exactly."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.frontend.openai.chat_template import render_chat
from tests.backend.models.test_gguf_types import loaded_as_hf

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MAX_NEW = 64
SYSTEM = ("You are a careful assistant for a team that runs a large web service. Answer in plain English, "
          "in two or three sentences, and say when you are not sure.")
QUESTIONS = [
    "What is the capital of France?", "Explain what a hash table is.", "Give me three tips for sleeping better.",
    "Why is the sky blue?", "Write a haiku about autumn.", "What does a CPU cache do?",
    "How do I boil an egg?", "Translate 'good morning' into Spanish and German.", "What is 17 times 23?",
    "Name the planets of the solar system.", "What is photosynthesis?", "Summarise the plot of Cinderella.",
    "How does paging work in an operating system?", "What are the primary colours?",
    "Tell me a fun fact about octopuses.", "What should I pack for a weekend hike?",
]


@pytest.fixture(scope="module")
def prompts(real_model_path: str) -> list[list[int]]:
    from kvserve.backend.models.gguf_checkpoint import field_value, open_gguf
    from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
    template = field_value(open_gguf(real_model_path), "tokenizer.chat_template")
    tok = load_engine_tokenizer(real_model_path)
    texts = [render_chat(template, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
             for q in QUESTIONS]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.fixture(scope="module")
def hf_model(real_model_path: str):
    from transformers import AutoModelForCausalLM
    path = Path(real_model_path)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # full lengths: the engine runs with ignore_eos
    model.generation_config.pad_token_id = 0
    return model.eval()


def _transformers_argmax(hf_model, prompt: list[int], output: list[int]) -> list[int]:
    """Transformers' greedy choice at every output position, given the tokens before it.

    Teacher forcing: one forward pass over prompt + output instead of 64 decode steps. Greedy
    decoding picks the argmax given the tokens so far, so the output is transformers' greedy
    output exactly when every position's argmax is the token kvserve chose there."""
    x = torch.tensor([prompt + output[:-1]])
    with torch.inference_mode():
        logits = hf_model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0]
    return logits[len(prompt) - 1:].argmax(dim=-1).tolist()


@pytest.fixture(scope="module")
def reference(hf_model, prompts, real_model_path) -> list[list[int]]:
    """kvserve's plain greedy tokens, each checked against transformers' choice."""
    ours, llm = _greedy(real_model_path, prompts, max_num_seqs=16)
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks
    for prompt, output in zip(prompts, ours):
        assert _transformers_argmax(hf_model, prompt, output) == output
    return ours


def _greedy(model: str, prompts, **engine_args) -> tuple[list[list[int]], LLM]:
    llm = LLM(model=model, dtype="float32", **engine_args)
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    return [o.outputs[0].token_ids for o in outs], llm


def test_tensors_equal_transformers(real_model_path: str, hf_model) -> None:
    theirs = hf_model.state_dict()
    for name, tensor in loaded_as_hf(real_model_path).items():
        assert torch.equal(tensor, theirs[name]), name


def test_plain(reference) -> None:
    assert len(reference) == 16 and all(len(out) == MAX_NEW for out in reference)


def test_chunked_prefill(real_model_path, prompts, reference) -> None:
    longest = max(len(p) for p in prompts)
    ours, _ = _greedy(real_model_path, prompts, max_num_seqs=16, max_num_batched_tokens=longest // 3)
    assert ours == reference


def test_prefix_cache_hits(real_model_path, prompts, reference) -> None:
    llm = LLM(model=real_model_path, dtype="float32", max_num_seqs=16, enable_prefix_caching=True)
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True)
    first = llm.generate(prompts[:1], params)  # caches the shared system prompt's blocks
    rest = llm.generate(prompts[1:], params)
    assert [o.outputs[0].token_ids for o in first + rest] == reference
    assert llm.engine.kv.prefix_hits > 0


def test_preemption(real_model_path, prompts, reference) -> None:
    need = max(len(p) for p in prompts) + MAX_NEW
    blocks = -(-need // 16) * 3 + 1  # room for about three requests of the sixteen at once
    ours, llm = _greedy(real_model_path, prompts, max_num_seqs=16, num_kv_blocks=blocks, block_size=16,
                        max_model_len=need)
    assert llm.engine.scheduler.num_preemptions_total > 0
    assert ours == reference


def test_one_at_a_time_on_the_grid_codes(real_model_path, prompts, reference) -> None:
    """One row per step takes the grid kernel (the Q4_1 and Q8_0 codes of the float32 weights):
    the same greedy tokens as the 16-row steps over the float32 weights."""
    ours, llm = _greedy(real_model_path, prompts[:4], max_num_seqs=1)
    model = llm.engine.runner.model
    from kvserve.kernels import cpu_native
    if cpu_native.linear_available():
        assert model.layers[0].gate_up_proj.grid.kind == 4 and model.logits_proj.grid.kind == 8
        # The tied embedding's lookup reads the same codes: no float32 table is held besides.
        assert type(model.embed_tokens).__name__ == "CodedEmbedding" and model.logits_proj.packed is None
    assert ours == reference[:4]
