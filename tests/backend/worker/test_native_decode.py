"""The native decode step (backend/worker/native_decode.py) against the per-operation path of the
same engine: the same kernels in the same order, so tokens and logprobs must be equal exactly,
not within a tolerance. Each case also checks that the native step really ran, and the cases it
must decline fall back without changing a result."""
from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.worker import native_decode
from kvserve.backend.worker.native_decode import NativeDecodeStep
from kvserve.backend.models.tiny import TinySpec, make_tiny_model
from kvserve.kernels import cpu_native
from tests.conftest import MODEL_CACHE

pytestmark = pytest.mark.skipif(torch.cuda.is_available() or not cpu_native.linear_available(),
                                reason="the native decode step is the CPU path's (AVX-512 or AVX2 + FMA + F16C, and a C compiler)")

SLIDING_QWEN2 = TinySpec(arch="qwen2", num_heads=4, num_kv_heads=1, sliding_window=8, seed=31)
# Gemma 3: sliding and full layers with their own rope tables, q/k norms, four norms, GeGLU.
GEMMA3 = TinySpec(arch="gemma3", num_layers=7, num_heads=4, num_kv_heads=1, head_dim=32, sliding_window=8, seed=32)


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 500) for _ in range(rng.randrange(1, 40))] for _ in range(n)]


class _Counted:
    """Wraps the model's native step to count the steps it took."""

    def __init__(self, step: NativeDecodeStep) -> None:
        self.step, self.taken = step, 0

    def run(self, *args):
        out = self.step.run(*args)
        self.taken += out is not None
        return out


def _native_and_per_op(llm: LLM, prompts, params: SamplingParams, **generate):
    """Outputs with the native step, then the same requests with it off; and how many steps it took.
    The engines run without prefix caching: a second run's prefix hits would change its prefills."""
    assert not llm.engine.config.enable_prefix_caching
    model = llm.engine.runner.model
    assert model.native_decode is not None, "the native step should apply to this engine"
    counted = _Counted(model.native_decode)
    model.native_decode = counted
    native = llm.generate(prompts, params, **generate)
    model.native_decode = None
    per_op = llm.generate(prompts, params, **generate)
    model.native_decode = counted.step
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks
    return native, per_op, counted.taken


def _assert_equal(native, per_op) -> None:
    for a, b in zip(native, per_op):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        assert a.outputs[0].logprobs == b.outputs[0].logprobs  # the same floats, not close ones


def _assert_native_equals_per_op(llm: LLM, prompts, params: SamplingParams, min_taken: int = 1, **generate):
    """Both paths give the same outputs, and the native step ran at least `min_taken` steps."""
    native, per_op, taken = _native_and_per_op(llm, prompts, params, **generate)
    _assert_equal(native, per_op)
    assert taken >= min_taken
    return native


GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)


@pytest.mark.parametrize("quantization", ["none", "int8", "int4", "int4-float32-activations"])
def test_tiny_llama_equals_the_per_operation_path(llama_dir, quantization, monkeypatch):
    # 10 prompts: the batch shrinks from 10 rows to 1 as they finish (int4 with float32 activations
    # takes its tiles from 5 rows, its strips below; with int8 ones, where they run, the strips always).
    if quantization == "int4-float32-activations":
        monkeypatch.setenv("KVSERVE_CPU_INT8_DOT", "0")
        quantization = "int4"
    llm = LLM(model=llama_dir, dtype="float32", max_num_seqs=16, quantization=quantization, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=2, ignore_eos=True)
    prompts = _prompts(10)
    _assert_native_equals_per_op(llm, prompts, params)


@pytest.mark.parametrize("kv_cache_dtype", ["bfloat16", "fp8_e4m3", "fp8_e5m2"])
def test_compressed_kv_caches_equal_the_per_operation_path(llama_dir, kv_cache_dtype):
    # The step writes keys and values as kv_quant.quantize does, and attends over the same bytes.
    llm = LLM(model=llama_dir, dtype="float32", max_num_seqs=8, kv_cache_dtype=kv_cache_dtype,
              enable_prefix_caching=False)
    _assert_native_equals_per_op(llm, _prompts(5, seed=4), GREEDY)


def test_sliding_window_and_qkv_bias_with_two_kv_groups():
    # Qwen2 with a window of 8: a full-attention layer and sliding ones, each group its own tables
    # and slots, and prompts longer than the window.
    model_dir = str(make_tiny_model(MODEL_CACHE / "native-decode-qwen2", SLIDING_QWEN2))
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=8, enable_prefix_caching=False)
    _assert_native_equals_per_op(llm, _prompts(6, seed=1), SamplingParams(max_tokens=20, temperature=0,
                                                                                          ignore_eos=True, logprobs=1))


def test_tiny_gemma3_equals_the_per_operation_path():
    model_dir = str(make_tiny_model(MODEL_CACHE / "native-decode-gemma3", GEMMA3))
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=8, enable_prefix_caching=False)
    _assert_native_equals_per_op(llm, _prompts(7, seed=3), SamplingParams(max_tokens=20, temperature=0,
                                                                                          ignore_eos=True, logprobs=1))


@pytest.mark.slow
def test_real_gemma3_equals_the_per_operation_path(gemma3_model_path):
    llm = LLM(model=gemma3_model_path, max_num_seqs=8, max_model_len=1024, enable_prefix_caching=False)
    prompts = ["The capital of France is", "def quicksort(xs):", "The three laws of motion are", "Once upon a time"]
    _assert_native_equals_per_op(llm, prompts, GREEDY, min_taken=GREEDY.max_tokens - 1)


def test_seeded_sampling_draws_the_same_tokens(llama_dir):
    llm = LLM(model=llama_dir, dtype="float32", max_num_seqs=8, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    _assert_native_equals_per_op(llm, _prompts(4, seed=2), params)


def test_real_model_grid_codes_equal_the_per_operation_path(real_model_path):
    # SmolLM2's GGUF: the grid strips at up to 6 rows, the grid tiles above (9 prompts).
    llm = LLM(model=real_model_path, max_num_seqs=16, enable_prefix_caching=False)
    prompts = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,", "def fib(n):",
               "Translate to French: good morning", "The three primary colours are", "Once upon a time",
               "SELECT * FROM", "import numpy as np\n"]
    _assert_native_equals_per_op(llm, prompts, GREEDY, min_taken=GREEDY.max_tokens - 1)


@pytest.fixture
def two_threads_and_halves_seen(monkeypatch):
    """Two threads (the halves' condition, on any machine), and the split row of every native step (0: none)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    seen: list[int] = []
    real = cpu_native.decode_step

    def spy(shape, *args):
        seen.append(shape._obj.split_row)
        return real(shape, *args)

    monkeypatch.setattr(cpu_native, "decode_step", spy)
    yield seen
    torch.set_num_threads(threads)


def test_two_halves_equal_the_per_operation_path(llama_dir, two_threads_and_halves_seen, monkeypatch):
    # Steps of 8 rows or more run as two halves, one a thread (cpu_decode_step.c), whatever they read
    # (the policy's bytes rule is tested apart); the batch shrinks below 8 as requests finish.
    monkeypatch.setattr(native_decode, "HALVES_MIN_KV_TO_WEIGHTS", 0.0)
    llm = LLM(model=llama_dir, dtype="float32", max_num_seqs=16, enable_prefix_caching=False)
    prompts = _prompts(12, seed=5)
    native, per_op, _ = _native_and_per_op(llm, prompts, [dataclasses.replace(GREEDY, max_tokens=4 + 2 * i)
                                                          for i in range(len(prompts))])
    _assert_equal(native, per_op)
    seen = two_threads_and_halves_seen
    assert any(seen) and not all(seen), seen


@pytest.mark.parametrize("spec", [SLIDING_QWEN2, GEMMA3], ids=["qwen2-two-kv-groups", "gemma3"])
def test_halves_with_sliding_windows_equal_the_per_operation_path(spec, two_threads_and_halves_seen, monkeypatch):
    # Each layer's tables, lengths and slots are its own KV group's, offset to each half's first row.
    monkeypatch.setattr(native_decode, "HALVES_MIN_KV_TO_WEIGHTS", 0.0)
    model_dir = str(make_tiny_model(MODEL_CACHE / f"native-decode-{spec.arch}", spec))
    llm = LLM(model=model_dir, dtype="float32", max_num_seqs=12, enable_prefix_caching=False)
    _assert_native_equals_per_op(llm, _prompts(10, seed=6), SamplingParams(max_tokens=16, temperature=0,
                                                                           ignore_eos=True, logprobs=1))
    assert any(two_threads_and_halves_seen)


def test_real_model_halves_equal_the_per_operation_path(real_model_path, two_threads_and_halves_seen, monkeypatch):
    # SmolLM2's grid tiles in halves of 4 and 5 rows: the policy is set to take every step of 8 rows or
    # more (short prompts read far less K/V than its weights), the rule under test is the bits.
    monkeypatch.setattr(native_decode, "HALVES_MIN_KV_TO_WEIGHTS", 0.0)
    llm = LLM(model=real_model_path, max_num_seqs=16, enable_prefix_caching=False)
    prompts = ["The capital of France is", "Write a haiku about the sea.", "1, 2, 3, 4,", "def fib(n):",
               "Translate to French: good morning", "The three primary colours are", "Once upon a time",
               "SELECT * FROM", "import numpy as np\n"]
    _assert_native_equals_per_op(llm, prompts, GREEDY, min_taken=GREEDY.max_tokens - 1)
    assert all(two_threads_and_halves_seen)


def test_halves_keep_each_verification_on_one_thread(llama_dir, two_threads_and_halves_seen, monkeypatch):
    # Three requests verifying 4 n-gram proposals each: 15 rows, whose middle row is inside the second
    # request. Its rows attend over the keys and values its earlier rows write in the same layer, so the
    # halves split where a request starts (middle_request_start, tested apart), and the output is plain
    # decoding's.
    monkeypatch.setattr(native_decode, "HALVES_MIN_KV_TO_WEIGHTS", 0.0)
    prompts = ["the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat",
               "one two three four five one two three four five one two three",
               "def add(a, b): return a + b\ndef add(a, b): return a + b\ndef add("]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, logprobs=1)
    spec = LLM(model=llama_dir, max_model_len=256, max_num_seqs=4, enable_prefix_caching=False,
               speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                   "prompt_lookup_max": 3, "load_policy": "off"})
    plain = LLM(model=llama_dir, max_model_len=256, max_num_seqs=4, enable_prefix_caching=False)
    with_halves = spec.generate(prompts, params)
    assert any(two_threads_and_halves_seen) and spec.engine.speculator.counters.num_accepted_tokens > 0
    _assert_equal(with_halves, plain.generate(prompts, params))


def test_the_halves_split_where_the_request_nearest_the_middle_starts():
    start = native_decode.middle_request_start
    table = lambda *blocks: list(blocks)  # noqa: E731
    # Eight single-row decodes: the middle row.
    assert start(torch.arange(8, dtype=torch.int32)[:, None], torch.full((8,), 40, dtype=torch.int32)) == 4
    # A decode (row 0), a verification of 5 rows (1-5), one of 2 (6-7): row 4 is inside the first
    # verification; the request starts nearest it are rows 6 and 1, and 6 is nearer.
    tables = torch.tensor([table(1, 2), *[table(3, 4)] * 5, *[table(5, 6)] * 2], dtype=torch.int32)
    lens = torch.tensor([30, 20, 21, 22, 23, 24, 17, 18], dtype=torch.int32)
    assert start(tables, lens) == 6
    # One request's rows only: no split.
    assert start(torch.tensor([table(3, 4)] * 6, dtype=torch.int32), torch.arange(20, 26, dtype=torch.int32)) == 0


def test_halves_policy_weighs_the_kv_reads_against_the_weights():
    # Two layers of one KV group, the second sliding over 100 positions; 1,000 bytes of K/V a position
    # and layer. 8 rows of 300 positions read 300 * 8 + 100 * 8 = 3,200 positions, 3.2 MB.
    meta = SimpleNamespace(seq_lens=torch.full((8,), 300, dtype=torch.int32))
    step = SimpleNamespace(model=SimpleNamespace(layers=[SimpleNamespace(window=None), SimpleNamespace(window=100)]),
                           kv_position_bytes=1000)
    halves = NativeDecodeStep._halves
    assert halves(step, 8, [meta, meta], weight_bytes=1_600_000)  # K/V exactly 2x the weights
    assert not halves(step, 8, [meta, meta], weight_bytes=1_600_001)
    short = SimpleNamespace(seq_lens=meta.seq_lens[:7])
    assert not halves(step, 7, [short, short], weight_bytes=1)  # too few rows, whatever they read


def test_declined_where_it_would_differ_or_cannot_run(llama_dir, monkeypatch):
    qwen3 = make_tiny_model(MODEL_CACHE / "qwen3", TinySpec(arch="qwen3", num_heads=4, num_kv_heads=2, head_dim=32,
                                                           seed=2))
    assert LLM(model=str(qwen3), dtype="float32").engine.runner.model.native_decode is None  # q/k norms
    assert LLM(model=llama_dir, dtype="float32", attention_backend="triton").engine.runner.model.native_decode is None
    monkeypatch.setenv("KVSERVE_CPU_DECODE_STEP", "0")
    assert LLM(model=llama_dir, dtype="float32").engine.runner.model.native_decode is None


def _lora_requests(model_dir: str, folder, ranks: tuple[int, ...]):
    """Adapters over all seven projections (the fused qkv and gate_up split by target), one per rank."""
    from kvserve.backend.lora import LoRARequest
    from kvserve.loadtests.lora.lora_ab import write_adapter
    return [LoRARequest(f"a{i}", i + 1, str(write_adapter(folder / f"a{i}", model_dir, rank, seed=40 + i)))
            for i, rank in enumerate(ranks)]


def test_with_lora_enabled_adapter_and_base_rows_take_it(llama_dir, tmp_path):
    # Adapter steps run their products inside the native step (cpu_decode_step.c's add_lora): rows
    # of three adapters (two ranks over all seven targets, one peft adapter on q and v only: the
    # other targets' rank is 0 in its slot) mixed with base-model rows, and base-only steps.
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from kvserve.backend.lora import LoRARequest
    from tests.backend.lora.peft_adapters import AdapterSpec, make_adapter
    hf = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
    qv = make_adapter(hf, tmp_path / "qv", AdapterSpec(rank=4, alpha=8, targets=("q_proj", "v_proj"), seed=0))
    adapters = [*_lora_requests(llama_dir, tmp_path, (16, 8)), LoRARequest("qv", 9, str(qv))]
    llm = LLM(model=llama_dir, dtype="float32", enable_lora=True, max_loras=4, max_lora_rank=16, max_num_seqs=16,
              enable_prefix_caching=False)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=2)
    _assert_native_equals_per_op(llm, _prompts(3), params, min_taken=params.max_tokens - 1)
    mixed = [adapters[0], None, adapters[1], adapters[2], adapters[0], adapters[1], None, adapters[2], adapters[0]]
    prompts = _prompts(len(mixed), seed=5)
    native = _assert_native_equals_per_op(llm, prompts, params, min_taken=params.max_tokens - 1,
                                          lora_request=mixed)
    # The adapters did change the outputs (the comparison above is not between two base runs).
    base = llm.generate(prompts, params)
    assert sum(a.outputs[0].token_ids != b.outputs[0].token_ids for a, b in zip(native, base)) >= 4
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.num_usable_blocks


def test_with_lora_enabled_gemma3_adapter_rows_take_it(tmp_path):
    # Gemma 3: o_proj's and down_proj's products land before their output norms.
    model_dir = str(make_tiny_model(MODEL_CACHE / "native-decode-gemma3", GEMMA3))
    adapters = _lora_requests(model_dir, tmp_path, (8, 4))
    llm = LLM(model=model_dir, dtype="float32", enable_lora=True, max_loras=2, max_lora_rank=8, max_num_seqs=8,
              enable_prefix_caching=False)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, logprobs=1)
    mixed = [adapters[0], adapters[1], None, adapters[1], adapters[0]]
    _assert_native_equals_per_op(llm, _prompts(len(mixed), seed=6), params, min_taken=params.max_tokens - 1,
                                 lora_request=mixed)


def test_prefill_steps_are_declined(llama_dir):
    llm = LLM(model=llama_dir, dtype="float32")
    counted = _Counted(llm.engine.runner.model.native_decode)
    llm.engine.runner.model.native_decode = counted
    llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
    assert counted.taken == 0  # one token: the prefill step alone
