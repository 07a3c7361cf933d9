"""On Gemma 3 270M (GGUF Q4_K_M, dequantized to float32): kvserve's greedy tokens equal
transformers' (`gguf_file=`, float32) for 16 completion prompts x 64 new tokens, checked position by
position against transformers; the same with chunked prefill, with prefix-cache hits and under
preemption; and on prompts of 600-1,500 tokens, past the sliding layers' 512-token window, so that
the window slides in prefill and during decode."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.backend import LLM, SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

MAX_NEW = 64
PROMPTS = [
    "The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,",
    "The three primary colors are", "東京は日本の", "1, 2, 3, 4, 5,", "Photosynthesis is the process",
    "import numpy as np\n\narr = np.", "The best way to learn a new language is", "In 1969, the first humans",
    "Water boils at", "SELECT name FROM users WHERE", "My favourite recipe for pancakes:",
    "La capitale de l'Italie est", "The mitochondria is", "Dear hiring manager,\n\n",
]
CORPUS = Path(__file__).resolve().parents[2] / "backend" / "models" / "corpus.txt"


@pytest.fixture(scope="module")
def tokenizer(gemma3_model_path: str):
    from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
    return load_engine_tokenizer(gemma3_model_path)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def long_prompts(tokenizer) -> list[list[int]]:
    """Four prompts of 600 to 1,500 tokens (the corpus, read from different places, repeated)."""
    ids = tokenizer.encode(CORPUS.read_text(encoding="utf-8"), add_special_tokens=False)
    text = (ids * (1 + 1600 // len(ids)))
    bos = tokenizer.encode("", add_special_tokens=True)
    return [bos + text[start:start + n] for start, n in ((0, 600), (37, 900), (211, 1200), (5, 1500))]


@pytest.fixture(scope="module")
def hf_model(gemma3_model_path: str):
    from transformers import AutoModelForCausalLM
    path = Path(gemma3_model_path)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


def _transformers_argmax(hf_model, prompt: list[int], output: list[int]) -> list[int]:
    """Transformers' greedy choice at every output position given the tokens before it (teacher
    forcing: one forward pass; greedy output is transformers' exactly when every argmax matches)."""
    x = torch.tensor([prompt + output[:-1]])
    with torch.inference_mode():
        logits = hf_model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0]
    return logits[len(prompt) - 1:].argmax(dim=-1).tolist()


def _greedy(llm: LLM, prompts) -> list[list[int]]:
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    return [list(o.outputs[0].token_ids) for o in outs]


@pytest.fixture(scope="module")
def plain_llm(gemma3_model_path: str) -> LLM:
    return LLM(model=gemma3_model_path, dtype="float32", max_num_seqs=16, max_model_len=2048)


@pytest.fixture(scope="module")
def reference(plain_llm, hf_model, prompts) -> list[list[int]]:
    ours = _greedy(plain_llm, prompts)
    kv = plain_llm.engine.kv
    assert kv.num_free_blocks == kv.num_usable_blocks
    for prompt, output in zip(prompts, ours):
        assert _transformers_argmax(hf_model, prompt, output) == output
    return ours


def test_plain(reference) -> None:
    assert len(reference) == 16 and all(len(out) == MAX_NEW for out in reference)


def test_mentions_paris(reference, tokenizer) -> None:
    assert "Paris" in tokenizer.decode(reference[0]) or "France" in tokenizer.decode(reference[0])


def test_long_prompts_past_the_window(plain_llm, hf_model, long_prompts) -> None:
    ours = _greedy(plain_llm, long_prompts)
    for prompt, output in zip(long_prompts, ours):
        assert _transformers_argmax(hf_model, prompt, output) == output


def test_chunked_prefill(gemma3_model_path, prompts, long_prompts, reference, hf_model) -> None:
    """Chunks of 200 tokens: the long prompts' chunks start past the window."""
    llm = LLM(model=gemma3_model_path, dtype="float32", max_num_seqs=16, max_model_len=2048,
              max_num_batched_tokens=200)
    assert _greedy(llm, prompts) == reference
    long_ours = _greedy(llm, long_prompts[:2])
    for prompt, output in zip(long_prompts[:2], long_ours):
        assert _transformers_argmax(hf_model, prompt, output) == output


def test_prefix_cache_hits(gemma3_model_path, long_prompts, hf_model) -> None:
    """The long prompts twice: the second pass starts from cached blocks, past the window too."""
    llm = LLM(model=gemma3_model_path, dtype="float32", max_num_seqs=16, max_model_len=2048,
              enable_prefix_caching=True)
    first = _greedy(llm, long_prompts[:2])
    hits = llm.engine.kv.prefix_hits
    assert _greedy(llm, long_prompts[:2]) == first
    assert llm.engine.kv.prefix_hits > hits
    for prompt, output in zip(long_prompts[:2], first):
        assert _transformers_argmax(hf_model, prompt, output) == output


def test_preemption(gemma3_model_path, prompts, reference) -> None:
    need = max(len(p) for p in prompts) + MAX_NEW
    # Six KV cache groups (one full, five sliding: these prompts stay inside the window, so each
    # group holds all of a request's blocks); room for about three of the sixteen requests at once.
    blocks = 6 * -(-need // 16) * 3 + 1
    llm = LLM(model=gemma3_model_path, dtype="float32", max_num_seqs=16, num_kv_blocks=blocks, block_size=16,
              max_model_len=need)
    assert _greedy(llm, prompts) == reference
    assert llm.engine.scheduler.num_preemptions_total > 0
