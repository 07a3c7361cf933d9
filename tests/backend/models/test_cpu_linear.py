"""oneDNN-packed float32 linears compute F.linear (to float32 rounding), and the CPU engine uses them."""
from __future__ import annotations

import pytest
import torch

from kvserve.backend import LLM
from kvserve.backend.models import cpu_linear
from kvserve.backend.models.cpu_linear import PackedLinear
from kvserve.kernels import cpu_native

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("rows", [1, 3, 16, 64, 300])
def test_packed_linear_is_f_linear(rows):
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 80, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(rows, 80, generator=gen)
    for bias in (None, b):
        torch.testing.assert_close(PackedLinear(w, bias)(x), torch.nn.functional.linear(x, w, bias),
                                   atol=1e-4, rtol=1e-5)
    assert PackedLinear(w, b)(x.view(1, rows, 80)).shape == (1, rows, 96)


def test_float32_tiles_are_the_one_copy_and_serve_prefill_rows():
    """Where the native kernels run, a float32 layer keeps only their tiles: no oneDNN copy for
    prefill (#30, one copy of the weights); a prompt's 300 rows take the tiles too."""
    gen = torch.Generator().manual_seed(5)
    w, b, x = torch.randn(40, 48, generator=gen), torch.randn(40, generator=gen), torch.randn(300, 48, generator=gen)
    layer = PackedLinear(w, b)
    if layer.native is None:
        pytest.skip("no native kernels here: oneDNN keeps its copy")
    assert layer.packed is None
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, w, b), atol=1e-4, rtol=1e-5)


def test_tiled_embedding_gathers_the_tables_rows():
    """A tied table kept only as the logits projection's tiles: the lookup gives its rows exactly,
    the last tile's rows (past a multiple of 16) included."""
    gen = torch.Generator().manual_seed(6)
    table = torch.randn(37, 24, generator=gen)
    packed = cpu_native.pack_linear(table)
    if packed is None:
        pytest.skip("no native kernels here")
    ids = torch.tensor([[0, 15, 16, 36], [36, 5, 0, 31]])
    assert torch.equal(cpu_linear.TiledEmbedding(packed, 24)(ids), table[ids])


def test_a_tied_float32_model_holds_its_table_once(qwen2_dir):
    model = LLM(model=qwen2_dir, dtype="float32").engine.runner.model
    if model.logits_proj.native is None:
        pytest.skip("no native kernels here")
    assert isinstance(model.embed_tokens, cpu_linear.TiledEmbedding)
    assert model.embed_tokens.tiles is model.logits_proj.native


@pytest.mark.parametrize("rows", [1, 7, 65, 300])
def test_a_few_rows_layer_keeps_no_onednn_copy_and_serves_every_row_count(rows):
    """The logits projection: its native copy takes every step (one row per sequence), so the
    float32 oneDNN copy is not kept where a native one exists."""
    gen = torch.Generator().manual_seed(rows)
    w, x = torch.randn(96, 64, generator=gen), torch.randn(rows, 64, generator=gen)
    layer = PackedLinear(w, None, few_rows=True)
    if layer.native is None and layer.grid is None:
        pytest.skip("no native kernels here: oneDNN keeps its copy")
    assert layer.packed is None
    torch.testing.assert_close(layer(x), torch.nn.functional.linear(x, w), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(layer(x.T.contiguous().T), torch.nn.functional.linear(x, w), atol=1e-4, rtol=1e-5)
    assert layer(x.view(1, rows, 64)).shape == (1, rows, 96)


def test_engine_packs_float32_cpu_models_only(llama_dir, monkeypatch):
    assert cpu_linear.wants_cpu_linear(torch.device("cpu"), torch.float32, "none")
    assert not cpu_linear.wants_cpu_linear(torch.device("cpu"), torch.bfloat16, "none")
    assert not cpu_linear.wants_cpu_linear(torch.device("cpu"), torch.float32, "int8")
    assert not cpu_linear.wants_cpu_linear(torch.device("cuda"), torch.float32, "none")
    model = LLM(model=llama_dir, dtype="float32").engine.runner.model
    assert isinstance(model.layers[0].gate_up_proj, PackedLinear) and isinstance(model.logits_proj, PackedLinear)
    monkeypatch.setenv("KVSERVE_CPU_PACKED_LINEAR", "0")
    model = LLM(model=llama_dir, dtype="float32").engine.runner.model
    assert isinstance(model.layers[0].gate_up_proj, torch.nn.Linear) and model.logits_proj is None
