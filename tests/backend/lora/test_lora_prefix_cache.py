"""The prefix cache and adapters: a prompt under one adapter never hits blocks another adapter (or
the base model) computed, hits under the same adapter, and base blocks serve base requests only;
the counters (kv.prefix_hits, the served kvserve:prefix_cache_hits_total) say so."""
from __future__ import annotations

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.lora import LoRARequest
from tests.backend.lora.peft_adapters import AdapterSpec, make_adapter

pytest.importorskip("peft")

PROMPT = list(range(5, 5 + 70))  # a few full blocks


@pytest.fixture(scope="module")
def llm_and_adapters(llama_dir, tmp_path_factory):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    root = tmp_path_factory.mktemp("lora-prefix")
    folders = {name: make_adapter(hf, root / name, AdapterSpec(4, 8, ("q_proj", "v_proj"), seed=seed))
               for name, seed in (("a", 1), ("b", 2))}
    llm = LLM(model=llama_dir, dtype="float32", enable_lora=True, max_loras=2, max_model_len=256)
    return llm, folders


def _hits(llm: LLM, lora: LoRARequest | None) -> tuple[int, int]:
    """(prefix-cache hit tokens, num_cached_tokens of the output) of one request for PROMPT."""
    kv = llm.engine.kv
    before = kv.prefix_hits
    out = llm.generate(PROMPT, SamplingParams(max_tokens=2, temperature=0, ignore_eos=True), lora_request=lora)[0]
    return kv.prefix_hits - before, out.num_cached_tokens


def test_the_same_prompt_hits_only_under_the_same_adapter(llm_and_adapters) -> None:
    llm, folders = llm_and_adapters
    a, b = LoRARequest("a", 1, str(folders["a"])), LoRARequest("b", 2, str(folders["b"]))
    block = llm.engine.kv.block_size
    full = (len(PROMPT) - 1) // block * block  # the whole blocks a repeat can take
    assert _hits(llm, None) == (0, 0)
    assert _hits(llm, a) == (0, 0)   # base blocks are not an adapter's
    assert _hits(llm, b) == (0, 0)   # nor are another adapter's
    assert _hits(llm, a) == (full, full)
    assert _hits(llm, b) == (full, full)
    assert _hits(llm, None) == (full, full)  # base blocks for base requests
    kv = llm.engine.kv
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_an_adapter_added_again_under_a_new_id_does_not_hit_the_old_blocks(llm_and_adapters) -> None:
    llm, folders = llm_and_adapters
    llm.engine.add_lora(LoRARequest("c", 3, str(folders["a"])))
    assert _hits(llm, LoRARequest("c", 3, str(folders["a"])))[0] == 0
    assert _hits(llm, LoRARequest("c", 3, str(folders["a"])))[0] > 0
    llm.engine.remove_lora("c")
    # The same name, other files: a new id, so none of the old adapter's blocks.
    assert _hits(llm, LoRARequest("c", 4, str(folders["b"])))[0] == 0
