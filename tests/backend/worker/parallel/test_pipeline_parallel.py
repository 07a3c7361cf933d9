"""Pipeline parallelism on a random tiny Llama with 12 heads (6 KV heads, 4 layers): PP=2 gives
PP=1's greedy tokens exactly, TP=3 x PP=2 (6 ranks) agrees with TP=1 with logits within 1e-4; each
stage holds only its layers and its layers' KV tensors; a size that does not divide the layers,
and the combinations the stages cannot run, are refused at start by name; a step's batch is cut
into contiguous micro-batches alike on every rank.

Both sides of each comparison run the per-operation path (KVSERVE_CPU_DECODE_STEP=0): the native
decode step is off on pipeline stages (it starts the layer stack with no residual), and the
comparison is of the split, not of two kernels."""
from __future__ import annotations

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine import ScheduledRequest, SchedulerOutput
from kvserve.backend.models.tiny import TinySpec, make_tiny_model
from kvserve.backend.worker.parallel.pipeline import split
from tests.backend.worker.parallel.tp_compare import compare, greedy_run
from tests.conftest import MODEL_CACHE

pytestmark = pytest.mark.timeout(600)

PROMPTS = ["hello world", "a b c d e f g h", "the quick brown fox jumps", "one two three"]
ARGS = dict(max_model_len=256, num_kv_blocks=64, num_threads=1)  # one thread per rank, both sides
MAX_TOKENS = 12
SPEC = TinySpec(arch="llama", hidden_size=96, intermediate_size=192, num_layers=4, num_heads=12, num_kv_heads=6,
                seed=12)


@pytest.fixture(scope="module")
def llama12_dir() -> str:
    return str(make_tiny_model(MODEL_CACHE / "llama12", SPEC))


@pytest.fixture()
def per_op(monkeypatch):
    monkeypatch.setenv("KVSERVE_CPU_DECODE_STEP", "0")  # inherited by the workers


@pytest.fixture(scope="module")
def single(llama12_dir):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVSERVE_CPU_DECODE_STEP", "0")
        return greedy_run(LLM(model=llama12_dir, **ARGS), PROMPTS, MAX_TOKENS)


def _run(model: str, **kw):
    llm = LLM(model=model, **ARGS, **kw)
    runner = llm.engine.runner
    try:
        return runner, greedy_run(llm, PROMPTS, MAX_TOKENS)
    finally:
        runner.close()


def test_pp2_gives_pp1s_tokens_exactly(llama12_dir, single, per_op):
    runner, run = _run(llama12_dir, pipeline_parallel_size=2)
    assert run.tokens == single.tokens
    result = compare(single, run)
    assert result.max_logit_diff < 1e-5, result
    # Rank 0 is the first stage: layers 0 and 1, the embedding, their KV tensors; no norm, no logits.
    model = runner.model
    assert (runner.stage.start, runner.stage.end, len(model.layers), len(runner.kv_caches)) == (0, 2, 2, 2)
    assert model.embed_tokens is not None and model.norm is None and model.lm_head is None
    assert runner.block_bytes * 2 == runner.kv_bytes_per_token * runner.block_size  # half the layers' bytes
    assert all(p.poll() is not None for p in runner.executor.procs)  # no rank left running


def test_tp3_by_pp2_against_tp1(llama12_dir, single, per_op):
    runner, run = _run(llama12_dir, tensor_parallel_size=3, pipeline_parallel_size=2)
    assert len(runner.executor.procs) == 5
    assert (runner.shard.num_heads, runner.shard.num_kv_heads, runner.stage.end) == (4, 2, 2)
    assert runner.kv_caches[0][0].shape[2] == 2 and len(runner.kv_caches) == 2
    result = compare(single, run)
    assert result.agreeing == len(PROMPTS), result
    assert result.max_logit_diff < 1e-4, result


def test_a_size_that_does_not_divide_the_layers_is_refused(llama12_dir):
    with pytest.raises(ValueError) as err:
        LLM(model=llama12_dir, pipeline_parallel_size=3, **ARGS)
    assert str(err.value) == ("pipeline_parallel_size: 3 does not divide the model's 4 layers (num_hidden_layers); "
                              "use a divisor of 4: [1, 2, 4]")
    with pytest.raises(ValueError, match="^tensor_parallel_size: 5 does not divide the model's 12 attention"):
        LLM(model=llama12_dir, tensor_parallel_size=5, pipeline_parallel_size=2, **ARGS)


def test_refused_combinations_name_themselves(llama12_dir):
    with pytest.raises(ValueError, match="^pipeline_parallel_size: 2 with quantization 'int8' is not supported"):
        LLM(model=llama12_dir, pipeline_parallel_size=2, quantization="int8", **ARGS)
    with pytest.raises(ValueError, match="^pipeline_parallel_size: 2 with enable_lora is not supported"):
        LLM(model=llama12_dir, pipeline_parallel_size=2, enable_lora=True, **ARGS)


def test_a_bad_micro_batch_count_is_refused_before_any_worker_starts(llama12_dir, monkeypatch):
    monkeypatch.setenv("KVSERVE_PP_MICRO_BATCHES", "0")
    with pytest.raises(ValueError, match="^KVSERVE_PP_MICRO_BATCHES: must be a positive integer, got '0'"):
        LLM(model=llama12_dir, pipeline_parallel_size=2, **ARGS)


def _out(lengths: list[int]) -> SchedulerOutput:
    return SchedulerOutput(scheduled=[ScheduledRequest(str(i), [1] * n, 0, [[]], True)
                                      for i, n in enumerate(lengths)])


@pytest.mark.parametrize("lengths, count, expected", [
    ([1, 1, 1, 1], 2, [["0", "1"], ["2", "3"]]),  # decodes: half each
    ([1, 1, 1], 2, [["0", "1"], ["2"]]),
    ([30, 1, 1, 1], 2, [["0"], ["1", "2", "3"]]),  # a long prefill alone
    ([1, 1, 1, 30], 2, [["0", "1", "2"], ["3"]]),
    ([5], 4, [["0"]]),  # never an empty micro-batch
    ([1, 1, 1, 1, 1], 4, [["0", "1"], ["2"], ["3"], ["4"]]),
    ([4, 4], 1, [["0", "1"]]),
])
def test_split_is_contiguous_balanced_and_never_empty(lengths, count, expected):
    parts = split(_out(lengths), count)
    assert [[s.request_id for s in p.scheduled] for p in parts] == expected


def test_speculative_rows_come_back_in_order(llama12_dir, single, per_op):
    """n-gram proposals: a request samples 1 + k rows; the micro-batches' rows return in request order."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    llm = LLM(model=llama12_dir, pipeline_parallel_size=2, speculative_config=spec, **ARGS)
    try:
        outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
        counters = llm.engine.speculator.counters
    finally:
        llm.engine.runner.close()
    assert [list(o.outputs[0].token_ids) for o in outs] == single.tokens
    assert counters.num_draft_tokens > 0  # proposals were verified through the stages
