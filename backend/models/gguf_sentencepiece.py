"""A SentencePiece vocabulary from GGUF metadata (`tokenizer.ggml.model` "llama": Llama 2, Mistral,
Gemma) as a `tokenizers` BPE model with its pre-tokenizer and decoder.

The file keeps pieces, scores and token types but no tokenizer.json. What is rebuilt here is the
tokenizer transformers' GGUF converter builds from the same metadata, the reference the tests hold
it to:
- BPE with byte fallback, not Unigram: these vocabularies come from SentencePiece's BPE trainer,
  and a character the vocabulary lacks is spelled as its UTF-8 bytes, the <0xNN> pieces;
- merges, where the file has none, follow from the vocabulary: each cut of a piece into two
  pieces is a merge, ranked by the merged piece's score (as llama.cpp merges: the pair whose
  merged piece scores best first), Gemma's by position (see _ranks);
- a space is the piece '▁'. `add_space_prefix` (on where the file is silent, as llama.cpp reads
  it) puts one before the text, and the decoder takes it off again. transformers ignores the
  flag (it always prefixes a Llama file's text, never a Gemma file's); Gemma's files say no
  prefix, so the two agree on them.
Special tokens and the BOS/EOS post-processor are gguf_tokenizer.py's, as for byte-level BPE.
"""
from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from kvserve.backend.models.gguf_checkpoint import field_value

SPACE = "\u2581"  # SentencePiece's spelling of a space

# Architectures whose files transformers reads as Gemma's (see _respell_space_runs, _ranks).
_GEMMA_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3"})


def sentencepiece_tokenizer(reader, tokens: list[str]) -> Tokenizer:
    gemma = field_value(reader, "general.architecture") in _GEMMA_ARCHITECTURES
    if gemma:
        tokens = _respell_space_runs(tokens)
    given = field_value(reader, "tokenizer.ggml.merges")
    merges = ([tuple(m.split(" ", 1)) for m in given] if given
              else derived_merges(tokens, _ranks(reader, len(tokens), gemma)))
    unk_id = field_value(reader, "tokenizer.ggml.unknown_token_id")
    unk = tokens[int(unk_id)] if unk_id is not None and 0 <= int(unk_id) < len(tokens) else None
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, unk_token=unk,
                               fuse_unk=True, byte_fallback=True))
    prefix = bool(field_value(reader, "tokenizer.ggml.add_space_prefix", True))
    # split=False: SentencePiece reads a text as one sequence, so a merge may span a space ("▁▁").
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first" if prefix else "never",
                                                 split=False)
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tok.decoder = decoders.Sequence((steps + [decoders.Strip(" ", 1, 0)]) if prefix else steps)
    return tok


def derived_merges(tokens: list[str], ranks: list[float]) -> list[tuple[str, str]]:
    """Every cut of a piece into two pieces of the vocabulary, lowest rank of the merged piece first.

    Among cuts of equal rank the longer left part comes first, then the longer right part, then
    the vocabulary's order: transformers breaks ties so, and a merge list orders every pair.
    """
    known = set(tokens)
    cuts = []
    for i, piece in enumerate(tokens):
        for at in range(1, len(piece)):
            left, right = piece[:at], piece[at:]
            if left in known and right in known:
                cuts.append((ranks[i], -at, at - len(piece), i, left, right))
    cuts.sort(key=lambda c: c[:4])
    return [(c[4], c[5]) for c in cuts]


def _ranks(reader, count: int, gemma: bool) -> list[float]:
    """Each piece's merge rank (lower merges first): its score, negated, or its position.

    Gemma's files give every control and user-defined piece (its runs of spaces among them) the
    one score -1000, which would rank them among the first ~1,500 pieces; transformers ranks
    Gemma's merges by position, the order the vocabulary lists them in, and so do we.
    """
    scores = field_value(reader, "tokenizer.ggml.scores")
    if gemma or not scores or len(scores) != count:
        return list(range(count))
    return [-float(s) for s in scores]


def _respell_space_runs(tokens: list[str]) -> list[str]:
    """Gemma stores its pieces of 2..31 spaces with real spaces, but text reaches the model with
    '▁' for each space: spelled so, BPE can reach them (transformers respells them too)."""
    known = set(tokens)
    return [SPACE * len(t) if t and t == " " * len(t) and SPACE * len(t) not in known else t for t in tokens]
