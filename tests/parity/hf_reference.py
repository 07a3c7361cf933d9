"""Greedy reference tokens from Hugging Face transformers, one prompt at a time, float32."""
from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def _hf_model(model_dir: str):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # compare full lengths: the engine runs with ignore_eos
    model.generation_config.pad_token_id = 0
    return model.eval()


def hf_greedy(model_dir: str, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    model = _hf_model(model_dir)
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                               min_new_tokens=max_new_tokens, do_sample=False)
            outs.append(y[0, len(ids):].tolist())
    return outs
