"""The expected tokens of the LoRA parity checks: transformers greedy decoding, with each PEFT
adapter applied, over the same prompts. Shared by the in-process parity test and the served one
(tests/e2e/test_lora_served.py), which both check SmolLM2 with the same three adapters."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tests.backend.lora.peft_adapters import AdapterSpec, make_adapter

# The check on the real default model: different ranks and targets, one rsLoRA.
SMOLLM2_SPECS = {
    "qv8": AdapterSpec(8, 16, ("q_proj", "v_proj"), seed=11, std=0.3),
    "mlp16": AdapterSpec(16, 32, ("gate_proj", "up_proj", "down_proj"), seed=12, std=0.3),
    "all4rs": AdapterSpec(4, 8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                          seed=13, std=0.2, use_rslora=True),
}
SMOLLM2_QUESTIONS = ["What is the capital of France?", "Explain what a hash table is.", "Why is the sky blue?",
                     "Write a haiku about autumn.", "How do I boil an egg?", "What is 17 times 23?",
                     "Name the planets of the solar system.", "Tell me a fun fact about octopuses."]


@dataclass
class Reference:
    folders: dict[str, Path]                 # adapter name -> its PEFT folder
    want: dict[str | None, list[list[int]]]  # adapter name (None: the base model) -> tokens per prompt


def hf_greedy(model, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Exactly n greedy tokens per prompt (the end token does not stop it), one prompt at a time."""
    out = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False, eos_token_id=None, pad_token_id=0)
            out.append(y[0, len(ids):].tolist())
    return out


def reference(hf, specs: dict[str, AdapterSpec], prompts: list[list[int]], n: int, folder: Path) -> Reference:
    """Write each adapter under `folder` and decode the prompts with it applied and without."""
    from peft import PeftModel
    folders = {name: make_adapter(hf, folder / name, spec) for name, spec in specs.items()}
    want: dict[str | None, list[list[int]]] = {None: hf_greedy(hf, prompts, n)}
    for name, path in folders.items():
        peft_model = PeftModel.from_pretrained(hf, str(path)).eval()
        want[name] = hf_greedy(peft_model, prompts, n)
        peft_model.unload()
        assert want[name] != want[None], f"adapter {name} does not change the greedy tokens: a weak test"
    return Reference(folders, want)


def smollm2_hf(real_model_path: str):
    """SmolLM2 in transformers, in float32, from the same GGUF file kvserve serves."""
    from transformers import AutoModelForCausalLM
    path = Path(real_model_path)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def smollm2_prompts(real_model_path: str) -> list[list[int]]:
    from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
    tok = load_engine_tokenizer(real_model_path)
    return [tok.encode(f"Question: {q}\nAnswer:", add_special_tokens=False) for q in SMOLLM2_QUESTIONS]
