"""Pipeline parallelism on the real default model (SmolLM2-135M-Instruct, GGUF Q4_1, 30 layers, tied
embeddings: both stages hold the embedding, the first to look tokens up, the last for the logits):
PP=2 against PP=1 on 16 chat prompts x 64 greedy tokens gives the same tokens, every one.

Both sides run the per-operation path (KVSERVE_CPU_DECODE_STEP=0: a pipeline stage never runs the
native decode step, docs/parallelism.md), so the comparison is of the split alone. Measured (this test,
16 x 64): 16/16 identical and the logits bit-identical (difference 0 on logits up to 40.8); the
bound below leaves float32's eps at the logits' scale for a micro-batch whose rows a matmul kernel
might block differently on another CPU."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM, SamplingParams
from tests.backend.worker.parallel.tp_compare import compare, greedy_run
from tests.parity.test_real_model_parity import MAX_NEW, prompts  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ARGS = dict(max_model_len=512, max_num_seqs=16, num_kv_blocks=400)


def test_pp2_against_pp1(real_model_path, prompts, monkeypatch):  # noqa: F811
    monkeypatch.setenv("KVSERVE_CPU_DECODE_STEP", "0")
    single = LLM(model=real_model_path, **ARGS)
    base = greedy_run(single, prompts, MAX_NEW)
    llm = LLM(model=real_model_path, pipeline_parallel_size=2, **ARGS)
    try:
        assert (llm.engine.runner.stage.start, llm.engine.runner.stage.end) == (0, 15)
        run = greedy_run(llm, prompts, MAX_NEW)
        # Prompt logprobs: the prompt rows' logits come back through the micro-batches in order.
        scoring = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=2)
        split = [o.prompt_logprobs for o in llm.generate(prompts[:6], scoring)]
    finally:
        llm.engine.runner.close()
    whole = [o.prompt_logprobs for o in single.generate(prompts[:6], scoring)]
    assert [[(e.token_id, [t for t, _ in e.top]) for e in p[1:]] for p in split] == [
        [(e.token_id, [t for t, _ in e.top]) for e in p[1:]] for p in whole]
    assert [e.logprob for p in split for e in p[1:]] == pytest.approx([e.logprob for p in whole for e in p[1:]],
                                                                      abs=1e-4)
    result = compare(base, run)
    print(f"PP=2 vs PP=1: {result.agreeing}/{len(prompts)} prompts identical, max logit difference "
          f"{result.max_logit_diff:.3g} (logits up to {result.max_abs_logit:.3g})")
    assert run.tokens == base.tokens
    assert result.max_logit_diff <= 1e-6 * result.max_abs_logit, result
