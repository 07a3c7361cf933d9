"""Tensor parallelism on random tiny models: TP=2 and TP=4 (more ranks than KV heads: replicated)
give TP=1's greedy tokens with logits within 1e-4; sizes that do not split a model are refused at
start, naming the numbers, before any worker starts; the workers stop with the engine."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM
from kvserve.backend.engine import EngineConfig
from tests.backend.worker.parallel.tp_compare import compare, greedy_run

pytestmark = pytest.mark.timeout(600)

PROMPTS = ["hello world", "a b c d e f g h", "the quick brown fox jumps", "one two three"]
ARGS = dict(max_model_len=256, num_kv_blocks=64)


@pytest.fixture(scope="module")
def llama_tp1(llama_dir):
    return greedy_run(LLM(model=llama_dir, **ARGS), PROMPTS, 24)


@pytest.mark.parametrize("tp", [2, 4])  # 4 heads, 2 KV heads: at 4 every KV head lives on two ranks
def test_greedy_tokens_and_logits_equal_tp1(llama_dir, llama_tp1, tp):
    llm = LLM(model=llama_dir, tensor_parallel_size=tp, **ARGS)
    try:
        runner = llm.engine.runner
        assert runner.shard.num_heads == 4 // tp and runner.shard.num_kv_heads == max(1, 2 // tp)
        assert runner.kv_caches[0][0].shape[2] == runner.shard.num_kv_heads  # only its KV heads are stored
        run = greedy_run(llm, PROMPTS, 24)
    finally:
        llm.engine.runner.close()
    result = compare(llama_tp1, run)
    assert result.agreeing == len(PROMPTS), result
    assert result.max_logit_diff < 1e-4, result
    assert all(p.poll() is not None for p in runner.executor.procs)  # no rank left running


def test_qkv_bias_tied_embeddings_and_one_kv_head(qwen2_dir):
    base = greedy_run(LLM(model=qwen2_dir, **ARGS), PROMPTS, 16)
    llm = LLM(model=qwen2_dir, tensor_parallel_size=2, **ARGS)
    try:
        run = greedy_run(llm, PROMPTS, 16)
    finally:
        llm.engine.runner.close()
    result = compare(base, run)
    assert result.agreeing == len(PROMPTS) and result.max_logit_diff < 1e-4, result


@pytest.mark.parametrize("tp, message", [
    (3, "tensor_parallel_size: 3 does not divide the model's 4 attention (query) heads"),
    (8, "tensor_parallel_size: 8 does not divide the model's 4 attention (query) heads"),
])
def test_a_size_that_does_not_divide_the_heads_is_refused(llama_dir, tp, message):
    with pytest.raises(ValueError) as err:
        LLM(model=llama_dir, tensor_parallel_size=tp, **ARGS)
    assert str(err.value).startswith(message), err.value


def test_refused_combinations_name_themselves(llama_dir):
    with pytest.raises(ValueError, match="^tensor_parallel_size: 2 with quantization 'int8' is not supported"):
        LLM(model=llama_dir, tensor_parallel_size=2, quantization="int8", **ARGS)
    with pytest.raises(ValueError, match="^tensor_parallel_size: 2 with enable_lora"):
        LLM(model=llama_dir, tensor_parallel_size=2, enable_lora=True, **ARGS)
    with pytest.raises(ValueError, match="^pipeline_parallel_size: must be a positive integer"):
        EngineConfig(model=llama_dir, pipeline_parallel_size=0)
    with pytest.raises(ValueError, match="^distributed_executor_backend: 'ray'"):
        EngineConfig(model=llama_dir, distributed_executor_backend="ray")
    with pytest.raises(ValueError, match="^distributed_executor_backend: must be 'mp' or 'ray'"):
        EngineConfig(model=llama_dir, distributed_executor_backend="threads")
    with pytest.raises(ValueError, match="^tensor_parallel_size: must be a positive integer"):
        EngineConfig(model=llama_dir, tensor_parallel_size=0)


def test_tp1_is_the_single_process_path(llama_dir):
    llm = LLM(model=llama_dir, **ARGS)
    runner = llm.engine.runner
    assert runner.executor is None and runner.group is None and runner.model.group is None
