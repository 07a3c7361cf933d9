"""A tiny model whose greedy output is known in advance: it cycles through
CYCLE_TEXT one *byte* token at a time, so every multi-byte character (é, 世,
界, 🙂) reaches the detokenizer split over 2-4 tokens.

The random tiny model's own output holds invalid byte sequences that rightly
decode to U+FFFD, so it cannot show that the server never breaks a character;
this one can, with an exact expected text. How: attention and MLP write
nothing (o_proj = down_proj = 0), so the last hidden state is the embedding of
the current token; token i of the cycle embeds to the unit vector e_i and the
lm_head row of its successor is e_i, so greedy decoding follows the cycle.
Every token outside the cycle embeds like its last token, so any prompt
starts the output at the cycle's beginning. Same loader, same engine, same
tokenizer as any checkpoint: only the weights are chosen, not random.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from tests.conftest import MODEL_CACHE, tiny_model

CYCLE_TEXT = "aé 世界🙂b"  # its UTF-8 bytes are all distinct: each byte token has one successor
_VERSION = 1


def _byte_token_ids(tokenizer_json: Path) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    # GPT-2 byte-level alphabet: printable bytes map to themselves, the others to U+0100 upwards.
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    ids = []
    for b in CYCLE_TEXT.encode("utf-8"):
        tid = tok.token_to_id(table[b])
        assert tid is not None, f"byte {b:#x} has no token"
        ids.append(tid)
    assert len(set(ids)) == len(ids)
    return ids


def make_cycle_model() -> str:
    out = MODEL_CACHE / "reliability-cycle"
    marker = out / "kvserve_cycle.json"
    if marker.is_file() and json.loads(marker.read_text()) == {"version": _VERSION, "text": CYCLE_TEXT}:
        return str(out)
    import torch
    from safetensors.torch import load_file, save_file

    base = Path(tiny_model("llama"))
    tmp = Path(tempfile.mkdtemp(prefix=".cycle-", dir=MODEL_CACHE))
    try:
        for f in base.iterdir():
            if f.is_file():
                shutil.copy(f, tmp / f.name)
        weights = load_file(str(base / "model.safetensors"))
        config = json.loads((base / "config.json").read_text())
        hidden, vocab = config["hidden_size"], weights["model.embed_tokens.weight"].shape[0]
        ids = _byte_token_ids(base / "tokenizer.json")
        assert len(ids) <= hidden
        embed = torch.zeros(vocab, hidden)
        embed[:] = torch.nn.functional.one_hot(torch.tensor(len(ids) - 1), hidden).float()  # others: like the last
        head = torch.zeros(vocab, hidden)
        for i, tid in enumerate(ids):
            embed[tid] = 0
            embed[tid, i] = 1.0
            head[ids[(i + 1) % len(ids)], i] = 4.0  # after the RMS norm, logit 32 for the successor, 0 elsewhere
        weights["model.embed_tokens.weight"] = embed
        weights["lm_head.weight"] = head
        weights["model.norm.weight"] = torch.ones(hidden)
        for name in list(weights):
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                weights[name] = torch.zeros_like(weights[name])
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        (tmp / "kvserve_cycle.json").write_text(json.dumps({"version": _VERSION, "text": CYCLE_TEXT}))
        os.remove(tmp / "kvserve_tiny.json")
        shutil.rmtree(out, ignore_errors=True)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(out)


def expected_text(num_tokens: int) -> str:
    """The output of `num_tokens` greedy steps (whole characters only when the count lands on one)."""
    data = CYCLE_TEXT.encode("utf-8")
    out = bytes(data[i % len(data)] for i in range(num_tokens))
    return out.decode("utf-8", errors="replace")
