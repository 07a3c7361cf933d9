"""Multi-LoRA through `kvserve serve` and the openai client, on SmolLM2 with the three parity
adapters (tests/backend/lora/peft_reference.py): every adapter's greedy text and the base model's,
mixed at concurrency 16, equal transformers + peft; /v1/models lists the adapters; run-time load
and unload while other adapters stream, and a request racing an unload; bad adapter files loaded
at run time refused by name; the prefix cache never crosses adapters; the LoRA metrics.

One server and one reference computation for the whole module (the reference decodes 32
prompts with transformers, the slow part)."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.serve_process import kvserve_serve

REPO = Path(__file__).resolve().parents[2]
# The timeout covers the module fixtures too: the reference decoding takes minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800), pytest.mark.skipif(
    importlib.util.find_spec("kvserve.backend.host") is None
    or not (REPO / "model_repository" / "llm" / "1" / "model.py").is_file(),
    reason="needs the embedded host and model_repository/llm/1/model.py")]
openai = pytest.importorskip("openai")
pytest.importorskip("peft")

API_KEY = "sk-lora-e2e"
MODEL = "SmolLM2-135M-Instruct"
N = 48  # greedy tokens per request
MAX_LORAS = 3


@dataclass
class Case:
    prompts: list[list[int]]
    folders: dict[str, Path]
    text: dict[str | None, list[str]]  # adapter (None: base) -> the reference text per prompt
    bad: dict[str, tuple[Path, str]]    # a bad adapter folder and what its refusal must say
    tokenizer: object


def _bad_folders(hf, good: Path, root: Path) -> dict[str, tuple[Path, str]]:
    """Adapter folders that must be refused at load time, each with the words naming its problem."""
    from safetensors.torch import load_file, save_file
    from tests.backend.lora.peft_adapters import AdapterSpec, make_adapter
    bad = {"rank": (make_adapter(hf, root / "rank32", AdapterSpec(32, 32, ("q_proj",), seed=5)),
                    "rank 32 exceeds max_lora_rank 16")}
    missing = shutil.copytree(good, root / "missing")
    tensors = load_file(str(missing / "adapter_model.safetensors"))
    del tensors["base_model.model.model.layers.3.self_attn.v_proj.lora_A.weight"]
    save_file(tensors, str(missing / "adapter_model.safetensors"))
    bad["missing"] = (missing, "missing tensor base_model.model.model.layers.3.self_attn.v_proj.lora_A.weight")
    target = shutil.copytree(good, root / "target")
    cfg = json.loads((target / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj", "v_proj", "fc1"]
    (target / "adapter_config.json").write_text(json.dumps(cfg))
    bad["target"] = (target, "target 'fc1' is not a module of the model")
    corrupt = shutil.copytree(good, root / "corrupt")
    weights = corrupt / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    bad["corrupt"] = (corrupt, "not a readable safetensors file")
    return bad


@pytest.fixture(scope="module")
def case(real_model_path: str, tmp_path_factory) -> Case:
    from kvserve.backend.engine.engine_tokenizer import load_engine_tokenizer
    from tests.backend.lora.peft_reference import SMOLLM2_SPECS, reference, smollm2_hf, smollm2_prompts
    hf, prompts = smollm2_hf(real_model_path), smollm2_prompts(real_model_path)
    root = tmp_path_factory.mktemp("lora-served")
    ref = reference(hf, SMOLLM2_SPECS, prompts, N, root)
    tok = load_engine_tokenizer(real_model_path)
    text = {name: [tok.decode(ids) for ids in runs] for name, runs in ref.want.items()}
    return Case(prompts, ref.folders, text, _bad_folders(hf, ref.folders["qv8"], root), tok)


class Served:
    def __init__(self, url: str) -> None:
        self.url = url
        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, timeout=300)

    def request(self, method: str, path: str, body: dict | None = None, key: str | None = API_KEY
                ) -> tuple[int, str]:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def complete(self, model: str | None, ids: list[int]) -> str:
        out = self.client.completions.create(model=model or MODEL, prompt=ids, max_tokens=N, temperature=0,
                                             extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == N
        return out.choices[0].text

    def stream(self, model: str, ids: list[int], first_chunk: threading.Event | None = None) -> tuple[str, float]:
        """The streamed text and when its first chunk came (monotonic)."""
        parts, first = [], None
        for chunk in self.client.completions.create(model=model, prompt=ids, max_tokens=N, temperature=0,
                                                    stream=True, extra_body={"ignore_eos": True}):
            if first is None:
                first = time.monotonic()
                if first_chunk is not None:
                    first_chunk.set()
            parts.append(chunk.choices[0].text if chunk.choices else "")
        return "".join(parts), first

    def metrics(self) -> str:
        status, text = self.request("GET", "/metrics", key=None)
        assert status == 200
        return text

    def models(self) -> dict[str, dict]:
        status, text = self.request("GET", "/v1/models")
        assert status == 200, text
        return {m["id"]: m for m in json.loads(text)["data"]}


@pytest.fixture(scope="module")
def served(case: Case):
    args = ["--port", "0", "--dtype", "float32", "--max-num-seqs", "16", "--max-model-len", "256",
            "--api-key", API_KEY, "--log-format", "console", "--enable-lora", "--max-loras", str(MAX_LORAS),
            "--max-cpu-loras", "6", "--max-lora-rank", "16", "--allow-runtime-lora-updating",
            "--lora-modules", *[f"{name}={path}" for name, path in case.folders.items()]]
    with kvserve_serve(args, timeout_s=300) as (_, line):
        assert f"model={MODEL}" in line, line
        yield Served(line.split()[3])


def _metric(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s series whose labels include `labels` (0 when none)."""
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:\{{([^}}]*)\}})? (\S+)$", text, re.M):
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def _series_labels(text: str, name: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} \S+$", text, re.M)]


def test_models_lists_each_adapter_with_its_parent(served: Served, case: Case) -> None:
    models = served.models()
    assert set(models) == {MODEL, *case.folders}
    for name, folder in case.folders.items():
        assert models[name]["parent"] == MODEL and models[name]["root"] == str(folder)


def test_unknown_adapter_is_404_model_not_found(served: Served, case: Case) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        served.complete("no-such-adapter", case.prompts[0])
    assert info.value.body["code"] == "model_not_found"


def test_three_adapters_and_the_base_mixed_at_concurrency_16_equal_peft(served: Served, case: Case) -> None:
    before = served.metrics()
    jobs = [(name, i) for i in range(len(case.prompts)) for name in (None, *case.folders)]  # 32 requests
    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda job: served.complete(job[0], case.prompts[job[1]]), jobs))
    wrong = [(name, i) for (name, i), text in zip(jobs, got) if text != case.text[name][i]]
    assert not wrong, f"{len(wrong)} of {len(jobs)} differ from transformers + peft: {wrong}"

    # The per-adapter request counts and vLLM's lora_requests_info, as /metrics shows them (the
    # engine's counters reach it with its next stats, a moment after the last answer).
    def counted(text: str) -> dict[str, float]:
        return {name: _metric(text, "kvserve:lora_requests_total", lora_name=name) -
                _metric(before, "kvserve:lora_requests_total", lora_name=name) for name in case.folders}
    want = {name: float(len(case.prompts)) for name in case.folders}
    deadline = time.monotonic() + 10
    while counted(after := served.metrics()) != want and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counted(after) == want
    info = _series_labels(after, "kvserve:lora_requests_info")
    assert info and all(s["max_lora"] == str(MAX_LORAS) for s in info)
    running = [set(filter(None, s["running_lora_adapters"].split(","))) for s in info]
    assert set().union(*running) == set(case.folders)  # each adapter was seen running
    assert all(len(r) <= MAX_LORAS for r in running)
    waiting = set().union(*(set(filter(None, s["waiting_lora_adapters"].split(","))) for s in info))
    assert waiting <= set(case.folders)


def test_runtime_load_while_other_adapters_stream(served: Served, case: Case) -> None:
    body = {"lora_name": "late-qv8", "lora_path": str(case.folders["qv8"])}
    status, text = served.request("POST", "/v1/load_lora_adapter", body, key=None)
    assert status == 401, text
    assert "late-qv8" not in served.models()
    streaming = threading.Event()
    with ThreadPoolExecutor(8) as pool:
        others = {(name, i): pool.submit(served.stream, name, case.prompts[i], streaming)
                  for name in ("mlp16", "all4rs") for i in range(3)}
        assert streaming.wait(120)
        status, text = served.request("POST", "/v1/load_lora_adapter", body)
        assert status == 200 and "late-qv8" in text, text
        late = {i: pool.submit(served.stream, "late-qv8", case.prompts[i]) for i in range(4)}
        assert {k: f.result()[0] for k, f in others.items()} == {k: case.text[k[0]][k[1]] for k in others}
        # The same files as qv8 under another name and id: qv8's tokens.
        assert {i: f.result()[0] for i, f in late.items()} == {i: case.text["qv8"][i] for i in late}
    assert served.models()["late-qv8"]["parent"] == MODEL
    status, text = served.request("POST", "/v1/load_lora_adapter", body)  # the same again: vLLM answers 400
    assert status == 400, text
    status, text = served.request("POST", "/v1/unload_lora_adapter", {"lora_name": "late-qv8"})
    assert status == 200, text
    assert "late-qv8" not in served.models()


def test_requests_racing_an_unload_end_cleanly_or_complete_with_their_adapter(served: Served, case: Case) -> None:
    status, text = served.request("POST", "/v1/load_lora_adapter",
                                  {"lora_name": "racer", "lora_path": str(case.folders["mlp16"])})
    assert status == 200, text

    def one(i: int):
        try:
            return served.stream("racer", case.prompts[i % len(case.prompts)], first)
        except openai.APIError as exc:  # a clean refusal: the adapter is gone
            return exc

    first = threading.Event()
    with ThreadPoolExecutor(12) as pool:
        before = [pool.submit(one, i) for i in range(8)]
        assert first.wait(120)
        status, text = served.request("POST", "/v1/unload_lora_adapter", {"lora_name": "racer"})
        unloaded_at = time.monotonic()
        assert status == 200, text
        after = [pool.submit(one, i) for i in range(4)]
        results = [f.result() for f in before]
        later = [f.result() for f in after]
    completed = 0
    for i, result in enumerate(results):
        if isinstance(result, Exception):
            assert "racer" in str(result) or getattr(result, "code", None) == "model_not_found", result
            continue
        text, first_at = result
        assert text == case.text["mlp16"][i], i  # completed: with its own adapter's tokens
        completed += 1
    # A stream that had begun before the unload holds the adapter to its end.
    began = [r for r in results if not isinstance(r, Exception) and r[1] < unloaded_at]
    assert completed >= len(began) >= 1
    for result in later:  # asked for after the unload answered
        assert isinstance(result, openai.NotFoundError) and result.body["code"] == "model_not_found", result
    # The server keeps serving, adapters and base.
    assert served.complete("all4rs", case.prompts[5]) == case.text["all4rs"][5]
    assert served.complete(None, case.prompts[5]) == case.text[None][5]


def test_bad_adapter_files_at_run_time_are_refused_by_name(served: Served, case: Case) -> None:
    for kind, (folder, words) in case.bad.items():
        status, text = served.request("POST", "/v1/load_lora_adapter",
                                      {"lora_name": f"bad-{kind}", "lora_path": str(folder)})
        assert 400 <= status < 500, (kind, status, text)
        error = json.loads(text)["error"]
        assert words in error["message"], (kind, error)
    assert not {f"bad-{kind}" for kind in case.bad} & set(served.models())
    status, text = served.request("POST", "/v1/unload_lora_adapter", {"lora_name": "never-loaded"})
    assert status == 404 and json.loads(text)["error"]["code"] == "model_not_found", text
    assert served.complete("qv8", case.prompts[2]) == case.text["qv8"][2]


def _prefix_hits_of(served: Served, model: str | None, ids: list[int]) -> float:
    """The prefix-cache hit tokens one request adds to the served counter."""
    before = _metric(served.metrics(), "kvserve:prefix_cache_hits_total")
    queries = _metric(served.metrics(), "kvserve:prefix_cache_queries_total")
    served.client.completions.create(model=model or MODEL, prompt=ids, max_tokens=1, temperature=0)
    deadline = time.monotonic() + 10
    while _metric(served.metrics(), "kvserve:prefix_cache_queries_total") == queries:
        assert time.monotonic() < deadline, "the prefix cache counters did not move"
        time.sleep(0.05)
    return _metric(served.metrics(), "kvserve:prefix_cache_hits_total") - before


def test_served_prefix_cache_never_crosses_adapters(served: Served, case: Case) -> None:
    ids = case.tokenizer.encode("Tell me, in great detail and at length, everything you know about the "
                                "history of the lighthouse keepers of the northern islands. " * 3,
                                add_special_tokens=False)
    assert _prefix_hits_of(served, "qv8", ids) == 0
    assert _prefix_hits_of(served, "mlp16", ids) == 0  # the same prompt, another adapter: no cross hits
    assert _prefix_hits_of(served, None, ids) == 0     # nor the base model
    assert _prefix_hits_of(served, "mlp16", ids) > 0   # the same adapter again: hits
    assert _prefix_hits_of(served, None, ids) > 0
