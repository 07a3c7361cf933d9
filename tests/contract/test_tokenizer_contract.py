"""Both sides read the model's tokenizer through one wrapper (kvserve.seam.tokenizer): the gateway's
chat prompts, /tokenize and logprob texts agree with the engine's ids by construction. Before, each
side had its own reader, and they differed: the gateway kept a tokenizer.json's truncation (it
would cut a long prompt the engine reads whole) and read the special tokens by other rules."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
from kvserve.seam.tokenizer import ModelTokenizer


def test_gateway_and_engine_read_one_folder_alike(llama_dir, tmp_path: Path) -> None:
    folder = tmp_path / "tok"
    folder.mkdir()
    tok = Tokenizer.from_file(str(Path(llama_dir) / "tokenizer.json"))
    tok.enable_truncation(8)  # a tokenizer.json may carry this; neither side may apply it
    tok.save(str(folder / "tokenizer.json"))
    eos = tok.id_to_token(2)
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": eos}, "bos_token": "x"}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [3]}))
    gateway, engine = ModelTokenizer.from_folder(folder), load_engine_tokenizer(folder)
    text = "many small words " * 20
    assert len(engine.encode(text, add_special_tokens=False)) > 8
    assert gateway.encode(text, add_special_tokens=False) == engine.encode(text, add_special_tokens=False)
    assert gateway.eos_token_ids == engine.eos_token_ids == {2, 3}
    assert (gateway.eos_token, gateway.bos_token) == (eos, "x")
    ids = engine.encode(text)
    assert [gateway.token_text(i) for i in ids] == [engine.decode([i], skip_special_tokens=False) for i in ids]
