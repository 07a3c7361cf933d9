"""`--quantization int4` on a GGUF file keeps each tensor's own codes (quantize.int4_linear): Q4's,
Q8's and Q8_HALVES' grids (Q6_K's) on the int8-activation strips, the tied table as its codes. The
weights the kernels read are the file's bit for bit, and decoding stays close to the unquantized
engine on the same file."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models import grid_weights
from kvserve.backend.models.cpu_linear import CodedEmbedding
from kvserve.backend.models.loader import load_model
from kvserve.backend.models.quantize import Int4Linear, quantize_model
from kvserve.kernels import cpu_native
from tests.backend.models.gguf_writer import write_random_gguf
from tests.backend.worker.test_native_decode import _assert_native_equals_per_op

pytestmark = pytest.mark.skipif(not cpu_native.int8_dot_available(),
                                reason="int4 keeps 4-bit codes on the int8 dot kernel (AVX-512 BW or AVX2) only")

PROMPTS = [[5, 17, 42], [300, 2, 9, 9, 9, 120, 64], list(range(40, 70))]


def _grid(linear) -> grid_weights.GridWeight:
    """The layer's codes as a grid of Q4's, Q8's or Q8_HALVES' layout (float16 constants widened back)."""
    if getattr(linear, "strip_kind", None) != grid_weights.Q4H_Q8:
        return linear.grid
    n, k = linear.out_features, linear.in_features
    blocks = linear.strips.view(-1, k // 32, 80)
    constants = blocks[..., 64:].contiguous().view(torch.float16).float().view(torch.uint8)
    strips = torch.cat([blocks[..., :64], constants], dim=-1).reshape(-1)
    return grid_weights.GridWeight(strips, None, grid_weights.Q4, n, k)


@pytest.mark.parametrize("kind,strip_kind", [("Q4_1", grid_weights.Q4H_Q8), ("Q4_K", grid_weights.Q4_Q8),
                                             ("Q8_0", grid_weights.Q8_Q8), ("Q6_K", grid_weights.Q8H_Q8)])
def test_int4_keeps_the_files_codes(kind, strip_kind, tmp_path: Path):
    path = write_random_gguf(tmp_path / f"random-{kind}.gguf", kind, seed=3)
    llm = LLM(model=str(path), dtype="float32", quantization="int4", max_num_seqs=4)
    model = llm.engine.runner.model
    loaded, _ = load_model(path, torch.float32, torch.device("cpu"), max_position=64)
    for layer, ref in zip(model.layers, loaded.layers):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            linear, weight = getattr(layer, name), getattr(ref, name).weight
            # Every type with codes on the int8-activation strips.
            assert type(linear) is Int4Linear, (kind, name)
            if strip_kind is not None and kind == "Q4_K":  # float16 constants wherever its products are float16 values
                assert linear.strip_kind in (grid_weights.Q4_Q8, grid_weights.Q4H_Q8)
            else:
                assert linear.strip_kind == strip_kind
            # The codes are the file's weights exactly (the int8-activation kinds read the grids' strips).
            assert torch.equal(grid_weights.dequantize(_grid(linear)), weight), (kind, name)
    exact = LLM(model=str(path), dtype="float32", max_num_seqs=4)
    assert type(model.embed_tokens) is type(exact.engine.runner.model.embed_tokens)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    ref = [o.outputs[0].token_ids for o in exact.generate(PROMPTS, params)]
    # Nothing was requantized, but the activations are rounded to int8: the first tokens agree.
    assert sum(g[0] == r[0] for g, r in zip(got, ref)) >= 2, (got, ref)


def test_a_tied_table_on_a_grid_serves_the_lookup_as_its_codes():
    """As without --quantization: the logits projection keeps the codes, and the lookup reads them."""
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (48, 64), generator=g).float()
    q[:, ::32] = 127
    table = (q.view(48, 2, 32) * (torch.rand(48, 2, 1, generator=g) * 0.01).half().float()).view(48, 64)
    model = torch.nn.Module()
    model.layers, model.lm_head = torch.nn.ModuleList(), None
    model.embed_tokens = torch.nn.Embedding.from_pretrained(table)
    quantize_model(model, "int4", torch.device("cpu"))
    assert isinstance(model.logits_proj, Int4Linear) and model.logits_proj.strip_kind == grid_weights.Q8_Q8
    assert isinstance(model.embed_tokens, CodedEmbedding)
    ids = torch.tensor([0, 7, 47])
    assert torch.equal(model.embed_tokens(ids), table[ids])


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K"])
def test_the_native_decode_step_reads_the_kept_codes_as_the_layers_do(kind, tmp_path: Path):
    path = write_random_gguf(tmp_path / f"random-{kind}.gguf", kind, seed=4)
    llm = LLM(model=str(path), dtype="float32", quantization="int4", max_num_seqs=8, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, logprobs=2)
    _assert_native_equals_per_op(llm, PROMPTS + [[7] * 12, [3, 4, 5]], params)
