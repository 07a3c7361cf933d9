"""quant_accuracy: its perplexity is transformers' on the same text (through prefill windows and
through decode steps), and the command reports every mode."""
from __future__ import annotations

import json
import math

import torch

from kvserve.backend import LLM
from kvserve.loadtests.studies import quant_accuracy
from tests.parity.hf_reference import _hf_model


def test_perplexity_equals_transformers(llama_dir):
    llm = LLM(model=llama_dir, dtype="float32")
    ids = llm.get_tokenizer().encode("Once upon a time there was a small server that answered questions " * 6)
    ours = quant_accuracy.perplexity(llm, ids, window=len(ids))
    with torch.inference_mode():
        loss = _hf_model(llama_dir)(torch.tensor([ids]), labels=torch.tensor([ids])).loss
    assert math.isclose(ours, math.exp(float(loss)), rel_tol=1e-4)
    # Windows change the number (less context per token), never the order of magnitude.
    assert 0.5 * ours < quant_accuracy.perplexity(llm, ids, window=16) < 2 * ours
    # Token by token through decode steps: the same model over the same context.
    assert math.isclose(quant_accuracy.decode_perplexity(llm, ids), ours, rel_tol=1e-4)


def test_command_reports_every_mode(llama_dir, tmp_path, capsys):
    out = tmp_path / "acc.json"
    rc = quant_accuracy.main(["--model", llama_dir, "--prompts", "3", "--tokens", "5", "--max-text-tokens", "80",
                              "--window", "32", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "int8" in text and "int4" in text and "(reference)" in text
    doc = json.loads(out.read_text())["results"]
    assert set(doc) == {"none", "int8", "int4"}
    for mode in ("int8", "int4"):
        assert doc[mode]["prompts"] == 3 and 0 <= doc[mode]["identical"] <= 3
        assert 0.0 <= doc[mode]["position_agreement"] <= 1.0 and doc[mode]["perplexity"] > 1.0
        assert doc[mode]["decode_perplexity"] > 1.0


def test_command_reports_kv_cache_dtypes(llama_dir, tmp_path, capsys):
    out = tmp_path / "kv.json"
    rc = quant_accuracy.main(["--model", llama_dir, "--prompts", "3", "--tokens", "5", "--max-text-tokens", "80",
                              "--window", "32", "--kv-dtypes", "fp8_e4m3", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "kv:fp8_e4m3" in text and "largest |K| stored" in text and "int8" not in text
    doc = json.loads(out.read_text())["results"]
    assert set(doc) == {"none", "kv:fp8_e4m3"}
    assert doc["none"]["kv_dtype"] == "float32" and doc["kv:fp8_e4m3"]["kv_dtype"] == "float8_e4m3fn"
    assert doc["kv:fp8_e4m3"]["kv_tokens_in_memory"] == 4 * doc["none"]["kv_tokens_in_memory"]
    assert doc["none"]["max_abs_k"] > 0 and doc["kv:fp8_e4m3"]["perplexity"] > 1.0
