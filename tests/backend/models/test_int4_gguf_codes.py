"""`--quantization int4` on a GGUF file keeps each tensor's own codes (quantize.int4_linear): 4-bit
blocks on the int8-activation strips, 8-bit ones on the exact grid kernels, the tied table as its
codes. The weights the kernels read are the file's bit for bit, and decoding stays close to the
unquantized engine on the same file."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.models import grid_weights
from kvserve.backend.models.cpu_linear import CodedEmbedding, PackedLinear
from kvserve.backend.models.loader import load_model
from kvserve.backend.models.quantize import Int4Linear, quantize_model
from kvserve.kernels import cpu_native
from tests.backend.models.gguf_writer import write_random_gguf

pytestmark = pytest.mark.skipif(not cpu_native.int8_dot_available(),
                                reason="int4 keeps 4-bit codes on the int8 dot kernel (AVX-512 BW) only")

PROMPTS = [[5, 17, 42], [300, 2, 9, 9, 9, 120, 64], list(range(40, 70))]


@pytest.mark.parametrize("kind,layer_type", [("Q4_1", Int4Linear), ("Q4_K", Int4Linear), ("Q8_0", PackedLinear)])
def test_int4_keeps_the_files_codes(kind, layer_type, tmp_path: Path):
    path = write_random_gguf(tmp_path / f"random-{kind}.gguf", kind, seed=3)
    llm = LLM(model=str(path), dtype="float32", quantization="int4", max_num_seqs=4)
    model = llm.engine.runner.model
    loaded, _ = load_model(path, torch.float32, torch.device("cpu"), max_position=64)
    for layer, ref in zip(model.layers, loaded.layers):
        for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
            linear, weight = getattr(layer, name), getattr(ref, name).weight
            assert type(linear) is layer_type, (kind, name)
            grid = (grid_weights.GridWeight(linear.strips, None, grid_weights.Q4, *weight.shape)
                    if layer_type is Int4Linear else linear.grid)
            if layer_type is Int4Linear:
                assert linear.strip_kind == grid_weights.Q4_Q8
            # The strips hold the file's weights exactly (Q4_Q8's strips are Q4's layout).
            assert torch.equal(grid_weights.dequantize(grid), weight), (kind, name)
    exact = LLM(model=str(path), dtype="float32", max_num_seqs=4)
    assert type(model.embed_tokens) is type(exact.engine.runner.model.embed_tokens)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]
    ref = [o.outputs[0].token_ids for o in exact.generate(PROMPTS, params)]
    if kind == "Q8_0":  # nothing was requantized and no activation rounded: the unquantized path itself
        assert got == ref
    else:  # int8 activations: the first tokens agree
        assert sum(g[0] == r[0] for g, r in zip(got, ref)) >= 2, (got, ref)


def test_a_tied_table_on_a_grid_serves_the_lookup_as_its_codes():
    """As without --quantization: the logits projection keeps the codes, and the lookup reads them."""
    g = torch.Generator().manual_seed(1)
    q = torch.randint(-127, 128, (50, 64), generator=g).float()
    q[:, ::32] = 127
    table = (q.view(50, 2, 32) * (torch.rand(50, 2, 1, generator=g) * 0.01).half().float()).view(50, 64)
    model = torch.nn.Module()
    model.layers, model.lm_head = torch.nn.ModuleList(), None
    model.embed_tokens = torch.nn.Embedding.from_pretrained(table)
    quantize_model(model, "int4", torch.device("cpu"))
    assert isinstance(model.logits_proj, PackedLinear) and isinstance(model.embed_tokens, CodedEmbedding)
    ids = torch.tensor([0, 7, 49])
    assert torch.equal(model.embed_tokens(ids), table[ids])
