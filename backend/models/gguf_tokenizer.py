"""The tokenizer, special tokens and chat template a GGUF file carries, as a `tokenizers` tokenizer.

GGUF stores a byte-level BPE vocabulary (`tokenizer.ggml.model` "gpt2") as
token strings, merges and token types; how text is split before BPE is named by
`tokenizer.ggml.pre`, whose regexes live in llama.cpp's code, not in the file.
The splits below are the ones llama.cpp applies for each name; an unknown name
is refused rather than guessed (a wrong split gives other token ids, silently).
A SentencePiece vocabulary ("llama": Llama 2, Mistral, Gemma) is rebuilt by
gguf_sentencepiece.py; any other tokenizer model is refused by name. Both kinds
share what follows: control and user-defined tokens matched whole, BOS/EOS.

Run as `python -m kvserve.backend.models.gguf_tokenizer MODEL CACHE_DIR` it writes
the Hugging Face files the gateway reads (tokenizer.json, tokenizer_config.json,
config.json, generation_config.json) into a folder under CACHE_DIR, once per
file version, and prints that folder: the gateway never imports the engine, and
both sides then tokenize with the same tokenizer.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from kvserve.backend.models.gguf_checkpoint import field_value, gguf_file, hf_config, open_gguf
from kvserve.backend.models.gguf_sentencepiece import sentencepiece_tokenizer
from kvserve.seam.tokenizer import ModelTokenizer

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types (1 normal, 2 unknown, 5 unused, 6 byte)
# Gemma's files name no end-of-turn token, but its chat turns end with this one, not with <eos>
# (its generation_config.json stops on both; llama.cpp finds it by this name too).
_GEMMA_END_OF_TURN = "<end_of_turn>"

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated"), _byte_level(False)])


# tokenizer.ggml.pre -> (pre-tokenizer factory, BPE ignore_merges)
_PRE_TOKENIZERS = {
    "default": (lambda: _byte_level(True), False),
    "gpt2": (lambda: _byte_level(True), False),
    # SmolLM: digits one by one, then GPT-2's split (as its Hugging Face tokenizer.json).
    "smollm": (lambda: pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                _byte_level(True)]), False),
    "llama-bpe": (lambda: _split_then_bytes(_LLAMA3_SPLIT), True),
    "llama3": (lambda: _split_then_bytes(_LLAMA3_SPLIT), True),
    "qwen2": (lambda: _split_then_bytes(_QWEN2_SPLIT), False),
}


def _strings(reader, key: str) -> list[str]:
    return list(field_value(reader, key, []) or [])


def _byte_level_bpe(reader, tokens: list[str]) -> Tokenizer:
    pre = field_value(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise ValueError(f"model: GGUF pre-tokenizer {pre!r} is not supported (supported: "
                         f"{', '.join(_PRE_TOKENIZERS)}); pass --tokenizer DIR with the model's tokenizer.json")
    merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
    make_pre, ignore_merges = _PRE_TOKENIZERS[pre]
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges, fuse_unk=False))
    tok.pre_tokenizer = make_pre()
    tok.decoder = decoders.ByteLevel()
    return tok


# tokenizer.ggml.model -> (builder of the model, pre-tokenizer and decoder; add_bos_token where the file is silent)
_MODELS = {
    "gpt2": (_byte_level_bpe, False),
    # llama.cpp adds BOS to a SentencePiece text unless the file says otherwise.
    "llama": (sentencepiece_tokenizer, True),
}


def build_tokenizer(reader) -> ModelTokenizer:
    kind = field_value(reader, "tokenizer.ggml.model")
    if kind not in _MODELS:
        raise ValueError(f"model: GGUF tokenizer model {kind!r} is not supported (supported: gpt2 byte-level "
                         "BPE, llama SentencePiece); pass --tokenizer DIR with the model's tokenizer.json")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    types = list(field_value(reader, "tokenizer.ggml.token_type", []) or [1] * len(tokens))
    build, bos_by_default = _MODELS[kind]
    tok = build(reader, tokens)
    # Matched whole in the text, before the model sees it; a piece the builder respelled (Gemma's
    # runs of spaces) is left to the model, which reaches it by its new spelling.
    added = [AddedToken(tokens[i], special=types[i] == _CONTROL, normalized=False) for i in range(len(tokens))
             if types[i] in (_CONTROL, _USER_DEFINED) and tok.token_to_id(tokens[i]) is not None]
    tok.add_tokens(added)

    def token_of(key: str) -> tuple[int | None, str | None]:
        value = field_value(reader, key)
        return (None, None) if value is None or not 0 <= int(value) < len(tokens) else (int(value), tokens[int(value)])

    bos_id, bos = token_of("tokenizer.ggml.bos_token_id")
    eos_id, eos = token_of("tokenizer.ggml.eos_token_id")
    eot_id, _ = token_of("tokenizer.ggml.eot_token_id")
    if eot_id is None and kind == "llama":
        eot_id = _control_id(tok, types, _GEMMA_END_OF_TURN)
    add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", bos_by_default)) and bos is not None
    add_eos = bool(field_value(reader, "tokenizer.ggml.add_eos_token", False)) and eos is not None
    if add_bos or add_eos:
        tok.post_processor = _template([(bos, bos_id)] if add_bos else [], [(eos, eos_id)] if add_eos else [])
    elif kind == "gpt2":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return ModelTokenizer(tok, eos_token_ids=(i for i in (eos_id, eot_id) if i is not None), bos_token=bos,
                          eos_token=eos, add_bos_token=add_bos, chat_template=field_value(reader, "tokenizer.chat_template"))


def _template(before: list[tuple[str, int]], after: list[tuple[str, int]]) -> processors.TemplateProcessing:
    """BOS before and EOS after each sequence, in transformers' shape (a pair repeats them around $B)."""
    def around(sequence: str) -> str:
        return " ".join([t for t, _ in before] + [sequence] + [t for t, _ in after])
    return processors.TemplateProcessing(single=around("$A"), pair=f"{around('$A')} {around('$B:1')}",
                                         special_tokens=before + after)


def _control_id(tok: Tokenizer, types: list[int], name: str) -> int | None:
    token_id = tok.token_to_id(name)
    return token_id if token_id is not None and types[token_id] == _CONTROL else None


def export_gateway_files(gguf_path: str | Path, out_dir: str | Path) -> Path:
    """Write the Hugging Face files the gateway reads for this GGUF model into out_dir (atomically)."""
    out_dir = Path(out_dir)
    reader = open_gguf(gguf_path)
    config = hf_config(reader)
    tok = build_tokenizer(reader)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out_dir.parent))
    tok.tokenizer.save(str(staging / "tokenizer.json"))
    tokenizer_config = {"bos_token": tok.bos_token, "eos_token": tok.eos_token,
                        "add_bos_token": tok.add_bos_token, "chat_template": tok.chat_template}
    files = {"tokenizer_config.json": tokenizer_config, "config.json": config,
             "generation_config.json": {"eos_token_id": sorted(tok.eos_token_ids)}}
    for name, content in files.items():
        (staging / name).write_text(json.dumps(content, indent=1, ensure_ascii=False), encoding="utf-8")
    (staging / "source.txt").write_text(str(Path(gguf_path).resolve()), encoding="utf-8")
    try:
        os.replace(staging, out_dir)
    except OSError:  # another process exported the same file first: keep its copy
        for child in staging.iterdir():
            child.unlink()
        staging.rmdir()
    return out_dir


def gateway_files_dir(model: str | Path, cache_root: str | Path) -> Path:
    """The exported files of a GGUF checkpoint under cache_root, one folder per file version."""
    gguf = gguf_file(model)
    if gguf is None:
        raise ValueError(f"model: {model} is not a GGUF checkpoint")
    resolved = gguf.resolve()
    stat = resolved.stat()
    key = hashlib.sha256(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    out = Path(cache_root) / f"{resolved.stem}-{key}"
    return out if (out / "tokenizer.json").is_file() else export_gateway_files(resolved, out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m kvserve.backend.models.gguf_tokenizer MODEL.gguf CACHE_DIR", file=sys.stderr)
        return 2
    try:
        print(gateway_files_dir(args[0], args[1]))
    except (ValueError, OSError) as exc:
        print(str(exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
