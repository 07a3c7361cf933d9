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
from tests.backend.lora.peft_adapters import AdapterSpec, make_adapter


def _hf_greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(y[0, len(ids):].tolist())
    return out


def _check(hf, engine_path: str, specs: dict[str, AdapterSpec], prompts, n: int, tmp: Path, **engine_args):
    from peft import PeftModel
    folders = {name: make_adapter(hf, tmp / name, spec) for name, spec in specs.items()}
    want = {None: _hf_greedy(hf, prompts, n)}
    for name, folder in folders.items():
        peft_model = PeftModel.from_pretrained(hf, str(folder)).eval()
        want[name] = _hf_greedy(peft_model, prompts, n)
        peft_model.unload()
        assert want[name] != want[None], f"adapter {name} does not change the greedy tokens: a weak test"
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
    from transformers import AutoModelForCausalLM
    from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
    path = Path(real_model_path)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    tok = load_engine_tokenizer(real_model_path)
    questions = ["What is the capital of France?", "Explain what a hash table is.", "Why is the sky blue?",
                 "Write a haiku about autumn.", "How do I boil an egg?", "What is 17 times 23?",
                 "Name the planets of the solar system.", "Tell me a fun fact about octopuses."]
    prompts = [tok.encode(f"Question: {q}\nAnswer:", add_special_tokens=False) for q in questions]
    specs = {"qv8": AdapterSpec(8, 16, ("q_proj", "v_proj"), seed=11, std=0.3),
             "mlp16": AdapterSpec(16, 32, ("gate_proj", "up_proj", "down_proj"), seed=12, std=0.3),
             "all4rs": AdapterSpec(4, 8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                          "down_proj"), seed=13, std=0.2, use_rslora=True)}
    _check(hf, real_model_path, specs, prompts, 48, tmp_path, max_model_len=256, max_num_seqs=16)
