"""LoRA parity: kvserve's greedy tokens with PEFT adapters equal transformers + peft on the same
weights, one adapter at a time and mixed with each other and the base model in one batch, on the
tiny random model (fast) and on the real default model (SmolLM2, three adapters of different ranks
and targets, one rsLoRA: the issue's check, in-process)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.lora import LoRARequest
from tests.backend.lora.peft_adapters import AdapterSpec
from tests.backend.lora.peft_reference import SMOLLM2_SPECS, reference, smollm2_hf, smollm2_prompts


def _check(hf, engine_path: str, specs: dict[str, AdapterSpec], prompts, n: int, tmp: Path, **engine_args):
    ref = reference(hf, specs, prompts, n, tmp)
    folders, want = ref.folders, ref.want
    llm = LLM(model=engine_path, dtype="float32", enable_lora=True, max_loras=len(specs), max_lora_rank=16,
              **engine_args)
    params = SamplingParams(max_tokens=n, temperature=0, ignore_eos=True)
    requests = {name: LoRARequest(name, i + 1, str(folder)) for i, (name, folder) in enumerate(folders.items())}
    requests[None] = None
    for name, lora in requests.items():  # one adapter at a time
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora_request=lora)]
        assert got == want[name], name
    # All of them and the base, mixed in one batch.
    order = [(name, i) for i in range(len(prompts)) for name in requests][:max(16, len(requests))]
    outs = llm.generate([prompts[i] for _, i in order], params, lora_request=[requests[name] for name, _ in order])
    assert [o.outputs[0].token_ids for o in outs] == [want[name][i] for name, i in order]
    kv = llm.engine.kv
    assert kv.num_free_blocks == kv.num_usable_blocks


def test_tiny_model_adapters_alone_and_mixed_equal_peft(llama_dir, tmp_path):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32).eval()
    specs = {"qv8": AdapterSpec(8, 16, ("q_proj", "v_proj"), seed=1, std=0.5),
             "all4": AdapterSpec(4, 8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                                 seed=2, std=0.5, use_rslora=True)}
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3, 2, 1, 10, 11], [20, 21, 22], [5] * 9]
    _check(hf, llama_dir, specs, prompts, 16, tmp_path, max_model_len=128)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_real_model_three_adapters_alone_and_mixed_equal_peft(real_model_path, tmp_path):
    specs, prompts = SMOLLM2_SPECS, smollm2_prompts(real_model_path)
    _check(smollm2_hf(real_model_path), real_model_path, specs, prompts, 48, tmp_path, max_model_len=256,
           max_num_seqs=16)
