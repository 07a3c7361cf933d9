"""SentencePiece tokenizers read from GGUF metadata (gguf_sentencepiece.py): small synthetic files
whose expected pieces are worked out by hand, the same files against transformers' GGUF converter,
and the real Gemma 3 270M vocabulary (262,144 pieces, merges derived) against transformers on
texts that reach every rule: spaces, byte fallback, control and user-defined tokens."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.backend.models.gguf_checkpoint import open_gguf
from kvserve.backend.models.gguf_sentencepiece import derived_merges
from kvserve.backend.models.gguf_tokenizer import build_tokenizer, export_gateway_files
from kvserve.seam.tokenizer import ModelTokenizer

_CONTROL, _USER_DEFINED, _BYTE = 3, 4, 6
CONTROLS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
USER_DEFINED = ["\n", "\n\n", "  "]  # "  ": Gemma spells its runs of spaces with real spaces
BYTES = [f"<0x{b:02X}>" for b in range(256)]
# "bc" is listed before "ab" but scores lower: ranked by score "ab" merges first, by position "bc".
NORMAL = ["▁", "t", "h", "e", "c", "a", "b", "s", "▁t", "he", "▁the", "at", "▁c", "▁cat", "bc", "ab", "▁a"]
NORMAL_SCORES = {"bc": -90.0, "ab": -20.0}


def write_sentencepiece_gguf(path: Path, *, arch: str = "llama", model: str = "llama", merges: list[str] | None = None,
                             add_space_prefix: bool | None = None, add_bos: bool | None = None,
                             add_eos: bool | None = None) -> Path:
    """A GGUF file with a SentencePiece vocabulary and the hyper-parameters hf_config reads (no tensors);
    None leaves a flag out of the file."""
    from gguf import GGUFWriter
    writer = GGUFWriter(str(path), arch)
    for key, value in (("block_count", 1), ("context_length", 64), ("embedding_length", 64),
                       ("feed_forward_length", 128), ("attention.head_count", 2), ("attention.head_count_kv", 2),
                       ("attention.key_length", 32), ("attention.value_length", 32),
                       ("attention.layer_norm_rms_epsilon", 1e-6), ("attention.sliding_window", 32),
                       ("rope.freq_base", 10000.0)):
        (writer.add_uint32 if isinstance(value, int) else writer.add_float32)(f"{arch}.{key}", value)
    tokens = CONTROLS + USER_DEFINED + BYTES + NORMAL
    scores = ([-1000.0] * len(CONTROLS + USER_DEFINED) + [0.0] * 256
              + [NORMAL_SCORES.get(t, -float(i)) for i, t in enumerate(NORMAL)])
    types = [_CONTROL] * len(CONTROLS) + [_USER_DEFINED] * len(USER_DEFINED) + [_BYTE] * 256 + [1] * len(NORMAL)
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    if merges is not None:
        writer.add_token_merges(merges)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    for flag, add in ((add_space_prefix, writer.add_add_space_prefix), (add_bos, writer.add_add_bos_token),
                      (add_eos, writer.add_add_eos_token)):
        if flag is not None:
            add(flag)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _synthetic(tmp_path: Path, name: str = "sp.gguf", **kwargs) -> ModelTokenizer:
    return build_tokenizer(open_gguf(write_sentencepiece_gguf(tmp_path / name, **kwargs)))


def _pieces(tok: ModelTokenizer, text: str, add_special_tokens: bool = True) -> list[str]:
    return tok.token_strings(tok.encode(text, add_special_tokens=add_special_tokens))


def test_a_space_prefix_and_merges_make_whole_words(tmp_path: Path) -> None:
    tok = _synthetic(tmp_path)  # no add_space_prefix in the file: on, as llama.cpp reads it
    assert _pieces(tok, "the cat") == ["<bos>", "▁the", "▁cat"]
    assert tok.decode(tok.encode("the cat")) == "the cat"  # the prefix space comes off again
    assert _pieces(tok, " the") == ["<bos>", "▁the"]  # a text that starts with a space gets no second one


def test_without_the_prefix_the_first_word_starts_bare(tmp_path: Path) -> None:
    tok = _synthetic(tmp_path, add_space_prefix=False)
    assert _pieces(tok, "the cat", add_special_tokens=False) == ["t", "he", "▁cat"]
    assert tok.decode(tok.encode(" the cat")) == " the cat"


def test_missing_characters_fall_back_to_utf8_bytes(tmp_path: Path) -> None:
    tok = _synthetic(tmp_path)
    assert _pieces(tok, "é\x01", add_special_tokens=False) == ["▁", "<0xC3>", "<0xA9>", "<0x01>"]
    assert tok.decode(tok.encode("cé\x01 a")) == "cé\x01 a"


def test_token_bytes_are_the_byte_pieces_and_the_spelled_text(tmp_path: Path) -> None:
    # what chat logprobs' `bytes` carry: a <0xNN> piece alone reads as U+FFFD, its byte is NN
    tok = _synthetic(tmp_path)
    ids = tok.encode("é the", add_special_tokens=False)
    assert tok.token_text(ids[1]) == tok.token_text(ids[2]) == "\ufffd"
    assert [tok.token_bytes(i) for i in ids] == [b" ", b"\xc3", b"\xa9", b" the"]
    assert b"".join(tok.token_bytes(i) for i in ids).decode() == " é the"
    assert tok.token_bytes(tok.encode("x")[0]) == b"<bos>"  # a control token: its text


def test_derived_merges_rank_by_score_and_gemma_by_position(tmp_path: Path) -> None:
    assert _pieces(_synthetic(tmp_path, add_space_prefix=False), "abc", add_special_tokens=False) == ["ab", "c"]
    gemma = _synthetic(tmp_path, "gemma.gguf", arch="gemma3", add_space_prefix=False)
    assert _pieces(gemma, "abc", add_special_tokens=False) == ["a", "bc"]


def test_merges_in_the_file_are_used_as_given(tmp_path: Path) -> None:
    tok = _synthetic(tmp_path, merges=["▁ t", "h e"])
    assert _pieces(tok, "the", add_special_tokens=False) == ["▁t", "he"]  # no "▁t he" merge: no "▁the"


def test_gemma_space_runs_are_reached_by_their_new_spelling(tmp_path: Path) -> None:
    gemma = _synthetic(tmp_path, arch="gemma3", add_space_prefix=False)
    ids = gemma.encode("a  b", add_special_tokens=False)
    assert ids[1] == len(CONTROLS) + USER_DEFINED.index("  ") and gemma.id_to_token(ids[1]) == "▁▁"
    assert gemma.decode(ids) == "a  b"
    assert ids[1] not in gemma.tokenizer.get_added_tokens_decoder()  # left to the merges, not matched in the text
    plain = _synthetic(tmp_path, "llama.gguf", add_space_prefix=False)  # elsewhere the piece stays as written
    assert plain.id_to_token(ids[1]) == "  " and ids[1] in plain.tokenizer.get_added_tokens_decoder()


def test_control_and_user_defined_tokens_match_whole(tmp_path: Path) -> None:
    tok = _synthetic(tmp_path, arch="gemma3", add_space_prefix=False)
    text = "<start_of_turn>\n\nthe cat<end_of_turn>"
    assert _pieces(tok, text) == ["<bos>", "<start_of_turn>", "\n\n", "t", "he", "▁cat", "<end_of_turn>"]
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == "\n\nthe cat"
    assert tok.decode(tok.encode(text), skip_special_tokens=False) == "<bos>" + text
    assert tok.eos_token_ids == {1, 5}  # Gemma's turns end with <end_of_turn>, which the file does not name


def test_bos_and_eos_are_added_as_the_file_asks(tmp_path: Path) -> None:
    tok = _synthetic(tmp_path, add_bos=False, add_eos=True)
    assert _pieces(tok, "the") == ["▁the", "<eos>"] and not tok.add_bos_token
    assert _pieces(tok, "the", add_special_tokens=False) == ["▁the"]
    assert _synthetic(tmp_path, "silent.gguf").add_bos_token  # SentencePiece files add BOS unless they say not


def test_an_unknown_tokenizer_model_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer model 'bert' is not supported"):
        _synthetic(tmp_path, model="bert")


def test_derived_merge_ties_go_to_the_longer_left_part_then_to_vocabulary_order() -> None:
    tokens = ["a", "b", "c", "ab", "bc", "abc", "ca"]
    merges = derived_merges(tokens, [0, 0, 0, 5, 5, 1, 5])
    assert merges == [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c"), ("c", "a")]


def test_the_exported_files_give_the_gateway_the_same_tokenizer(tmp_path: Path) -> None:
    path = write_sentencepiece_gguf(tmp_path / "sp.gguf", add_eos=True)
    ours = build_tokenizer(open_gguf(path))
    gateway = ModelTokenizer.from_folder(export_gateway_files(path, tmp_path / "meta"))
    for text in ["the cat", "  é\n\nabc<end_of_turn>", "<start_of_turn>x"]:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert gateway.encode(text, add_special_tokens=special) == ids
            assert gateway.decode(ids, skip_special_tokens=False) == ours.decode(ids, skip_special_tokens=False)
    assert (gateway.bos_token, gateway.eos_token, gateway.add_bos_token) == ("<bos>", "<eos>", True)
    assert gateway.eos_token_ids == ours.eos_token_ids == {1, 5}


SYNTHETIC_TEXTS = ["the cat", " the  cat ", "abc", "é\x01x", "<start_of_turn>\n\nthe<end_of_turn>", "a  b   c", ""]


@pytest.mark.slow
@pytest.mark.parametrize("arch, prefix", [("llama", None), ("gemma3", False)])
def test_synthetic_files_tokenize_as_transformers(tmp_path: Path, arch: str, prefix: bool | None) -> None:
    from transformers import AutoTokenizer
    path = write_sentencepiece_gguf(tmp_path / "sp.gguf", arch=arch, add_space_prefix=prefix)
    theirs = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    ours = build_tokenizer(open_gguf(path))
    for text in SYNTHETIC_TEXTS:
        for special in (True, False):
            ids = theirs(text, add_special_tokens=special)["input_ids"]
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (True, False):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


# --- The real Gemma 3 270M vocabulary -------------------------------------------------------------------

@pytest.fixture(scope="module")
def gemma3_path(gemma3_model_path: str) -> Path:
    """Gemma 3 270M's GGUF file, the known model `gemma-3-270m` (fetched once into the cache)."""
    return Path(gemma3_model_path)


@pytest.fixture(scope="module")
def gemma3_ours(gemma3_path: Path) -> ModelTokenizer:
    return build_tokenizer(open_gguf(gemma3_path))


@pytest.fixture(scope="module")
def gemma3_theirs(gemma3_path: Path):
    from transformers import AutoTokenizer  # ~25 s on this vocabulary: once per module
    return AutoTokenizer.from_pretrained(str(gemma3_path.parent), gguf_file=gemma3_path.name)


@pytest.fixture(scope="module")
def gemma3_gateway(gemma3_path: Path, tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    try:
        folder = export_gateway_files(gemma3_path, tmp_path_factory.mktemp("gemma3") / "meta")
    except ValueError as exc:
        if "architecture 'gemma3' is not supported" in str(exc):
            pytest.skip(f"hf_config does not know Gemma 3 yet: {exc}")
        raise
    return ModelTokenizer.from_folder(folder)


RARE = "𠀀𠀁𠀂 𪚥 𰻞"  # CJK extensions B and G: not pieces of the vocabulary
GEMMA3_TEXTS = [
    "The capital of France is",
    "x" + " " * 40 + "y\n" + " " * 33 + "z",  # longer than the longest run piece: merges split it, 16 + 24
    "In 1969, Apollo 11 landed on the Moon; 3.14159 is close to pi.",
    "def f(x):\n    if x > 0:\n        return x ** 2\n    return -x\n",
    "class Foo:\n\tdef __init__(self):\n\t\tself.x = {'a': [1, 2, 3]}\n",
    "\tindented\twith\ttabs\n\t\t\tthree",
    "你好，世界！今天天气很好。",
    "東京は日本の首都です。ひらがなとカタカナ",
    "안녕하세요, 만나서 반갑습니다.",
    "I love 🍕 and 🚀!",
    "Family 👨\u200d👩\u200d👧\u200d👦, flags 🇫🇷🇯🇵, thumbs 👍🏽, rainbow 🏳️\u200d🌈",
    "a  b   c    d     e      f",
    "line1\n\nline2\n\n\n\nline3\r\nline4\n",
    "   leading and trailing   ",
    "        ",
    " one leading space",
    RARE,
    "bell\x07 null\x00 esc\x1b[31m del\x7f",
    "Привет, مرحبا, שלום, नमस्ते, สวัสดี, Γειά σου",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos> <eos> <pad> <unk> <mask> <unused0> [multimodal]",
    "<start_of_turn >, < bos>, <<bos>>, <0x41>",
    '<div class="x">https://example.com/path?q=1&r=2</div>',
    "∑_{i=1}^{n} x_i² ≤ ∞ — “quotes” ‘single’ … ©®™",
    "Café crème brûlée, naïve façade, Ångström",
    "e\u0301 and é; A\u030a and Å",
    "zero\u200bwidth non\u00a0breaking\u2009thin\u3000ideographic",
    '{"name": "kvserve", "ids": [1, 2, 3], "ok": true}',
    "Mixing English, 中文, русский and emoji 😀 in one line.\n\tEnd.",
    "",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", GEMMA3_TEXTS)
def test_gemma3_encodes_and_decodes_as_transformers(gemma3_ours, gemma3_theirs, text: str) -> None:
    for special in (True, False):
        ids = gemma3_theirs(text, add_special_tokens=special)["input_ids"]
        assert gemma3_ours.encode(text, add_special_tokens=special) == ids
        for skip in (True, False):
            assert gemma3_ours.decode(ids, skip_special_tokens=skip) == gemma3_theirs.decode(
                ids, skip_special_tokens=skip)


@pytest.mark.slow
@pytest.mark.parametrize("text", GEMMA3_TEXTS)
def test_gemma3_gateway_files_encode_alike(gemma3_ours, gemma3_gateway, text: str) -> None:
    for special in (True, False):
        ids = gemma3_ours.encode(text, add_special_tokens=special)
        assert gemma3_gateway.encode(text, add_special_tokens=special) == ids
        decoded = gemma3_ours.decode(ids, skip_special_tokens=False)
        assert gemma3_gateway.decode(ids, skip_special_tokens=False) == decoded


@pytest.mark.slow
def test_gemma3_special_tokens_and_byte_fallback(gemma3_ours, gemma3_gateway) -> None:
    assert gemma3_ours.encode("The capital of France is") == [2, 818, 5279, 529, 7001, 563]
    assert gemma3_ours.vocab_size == 262_144 and gemma3_ours.add_bos_token
    assert gemma3_ours.eos_token_ids == gemma3_gateway.eos_token_ids == {1, 106}  # <eos>, <end_of_turn>
    rare = gemma3_ours.token_strings(gemma3_ours.encode(RARE, add_special_tokens=False))
    assert any(p.startswith("<0x") for p in rare), rare  # the texts above do reach byte fallback
    assert gemma3_ours.decode(gemma3_ours.encode(RARE)) == RARE
