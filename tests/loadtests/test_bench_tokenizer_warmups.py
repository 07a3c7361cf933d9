"""`kvserve bench --tokenizer` (a local tokenizer instead of the server's
/tokenize) and `--num-warmups`, against the fake SSE server."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors

from kvserve.loadtests.bench.bench_cli import main
from kvserve.loadtests.bench.prompt_builder import WORDS

from fake_openai_server import count_body


def _word_tokenizer(tmp_path: Path) -> Path:
    """One token per word plus a BOS: unlike the fake server's count, where
    words of 7+ letters cost two, so the test can tell whose count was used."""
    vocab = {"<s>": 0, "<unk>": 1, **{w: i + 2 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    return folder


def _local_count(folder: Path, text: str) -> int:
    return len(Tokenizer.from_file(str(folder / "tokenizer.json")).encode(text).ids)


def _bench(server, tmp_path: Path, name: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / f"{name}.json"
    rc = main(["--base-url", server.url, "--json", str(out), "--disable-tqdm", *extra])
    return rc, (json.loads(out.read_text()) if out.exists() else {})


def test_local_tokenizer_gives_exact_lengths_without_the_servers_tokenize(fake_server, tmp_path):
    tok = _word_tokenizer(tmp_path)
    server = fake_server(tokenize=False)
    rc, doc = _bench(server, tmp_path, "a", "--num-prompts", "6", "--random-input-len", "30",
                     "--random-output-len", "5", "--tokenizer", str(tok))
    assert rc == 0
    assert doc["dataset"]["exact_prompt_lengths"] is True
    assert [_local_count(tok, b["prompt"]) for b in server.bodies] == [30] * 6
    # The calibration kept long words too (one token each locally), which the server counts as two;
    # its usage (total_input_tokens) is its own count.
    assert doc["total_input_tokens"] == sum(count_body(b) for b in server.bodies) > 6 * 30


def test_local_tokenizer_sends_the_same_texts_to_any_server(fake_server, tmp_path):
    tok = _word_tokenizer(tmp_path)
    one, other = fake_server(tokenize=True), fake_server(tokenize=False)
    flags = ("--num-prompts", "4", "--random-input-len", "20", "--random-output-len", "3", "--tokenizer", str(tok))
    assert _bench(one, tmp_path, "one", *flags)[0] == 0
    assert _bench(other, tmp_path, "other", *flags)[0] == 0
    assert sorted(b["prompt"] for b in one.bodies) == sorted(b["prompt"] for b in other.bodies)


def test_warmups_are_sent_first_and_not_counted(fake_server, tmp_path):
    server = fake_server()
    rc, doc = _bench(server, tmp_path, "w", "--num-prompts", "5", "--random-input-len", "12",
                     "--random-output-len", "4", "--num-warmups", "3", "--max-concurrency", "2")
    assert rc == 0
    assert doc["completed"] == 5 and doc["total_output_tokens"] == 5 * 4
    assert len(server.bodies) == 3 + 5
    warm = [b["prompt"] for b in server.bodies[:3]]
    assert len(set(warm)) == 1  # copies of one prompt, as vllm bench serve sends
    assert warm[0] in [b["prompt"] for b in server.bodies[3:]]


def test_bad_tokenizer_or_warmup_flags_fail_before_any_traffic(fake_server, tmp_path, capsys):
    server = fake_server()
    assert main(["--base-url", server.url, "--num-warmups", "-1"]) == 2
    assert "--num-warmups" in capsys.readouterr().err
    assert main(["--base-url", server.url, "--tokenizer", str(tmp_path), "--endpoint-type", "chat"]) == 2
    assert "--tokenizer" in capsys.readouterr().err
    assert main(["--base-url", server.url, "--tokenizer", str(tmp_path / "missing"), "--num-prompts", "1",
                 "--disable-tqdm"]) == 2
    assert "no tokenizer.json" in capsys.readouterr().err
    assert server.bodies == []
