"""Greedy tokens of the engine equal transformers' on a real checkpoint (SmolLM2-135M-Instruct, float32).

The tiny random models of test_hf_parity.py have no near-ties worth the name;
a trained model's logits do, so this is where a change of arithmetic order
(fused ops, a compiled forward, another attention kernel) would show. Runs when
the folder exists: KVSERVE_REAL_MODEL, default /tmp/smollm2-hf.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvserve.backend import LLM, SamplingParams
from tests.parity.hf_reference import hf_greedy

REAL_MODEL = os.environ.get("KVSERVE_REAL_MODEL", "/tmp/smollm2-hf")
MAX_NEW = 24
PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "def fibonacci(n):",
    "The three laws of thermodynamics are",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1800),  # transformers one prompt at a time on a shared 2-core machine
    pytest.mark.skipif(not (Path(REAL_MODEL) / "config.json").is_file(), reason=f"no model folder at {REAL_MODEL}"),
]


def test_real_model_batched_greedy_matches_transformers():
    llm = LLM(model=REAL_MODEL, dtype="float32", max_num_seqs=8)
    tok = llm.get_tokenizer()
    # One long prompt (a few blocks of context) beside the short ones.
    prompts = [tok.encode(p) for p in PROMPTS] + [tok.encode(" ".join(PROMPTS) * 3)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0, ignore_eos=True))
    ours = [o.outputs[0].token_ids for o in outs]
    assert ours == hf_greedy(REAL_MODEL, prompts, MAX_NEW)
