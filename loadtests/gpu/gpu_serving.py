"""The GPU check's serving stage: `kvserve serve` on random models of real shapes, `kvserve bench`
at several concurrencies, transformers beside it on the same prompts.

    python -m kvserve.loadtests.gpu.gpu_serving OUT_DIR [--models smollm2-135m llama3-1b] [--budget-s 300]
    python -m kvserve.loadtests.gpu.gpu_serving OUT_DIR --smoke      # the CPU dry run: a tiny model, tiny load

Per model: `kvserve make-tiny-model` writes the weights (random, seeded; real weights do not
travel to the GPU machine), one `kvserve serve` starts and is warmed up, then for each
concurrency C one `kvserve bench --compare --base-url` runs (b) transformers static batches
of C and (d) the server with at most C requests in flight, on the same token-id prompts;
at C=1 also (a) transformers one request at a time. Then, for the first model, the server
again with --enforce-eager at C=1 and C=64: CUDA graphs on against off (graphs_over_eager).
Each run's JSON lands in OUT_DIR as serve_<label>_c<C>.json, and serving.json sums them up
(output tokens/s and the ratios).
The whole stage keeps to --budget-s: a step that would start past it is skipped and says so.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvserve.backend.models.tiny import TinySpec, make_tiny_model

# Shapes of the real checkpoints (config.json of each); vocabularies as theirs, so the LM head costs what it costs.
MODEL_SHAPES: dict[str, TinySpec] = {
    "smollm2-135m": TinySpec(arch="llama", hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                             num_kv_heads=3, vocab_size=49152, max_position=4096, tie_word_embeddings=True,
                             dtype="bfloat16", rope_theta=100000.0),
    "llama3-1b": TinySpec(arch="llama", hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                          num_kv_heads=8, head_dim=64, vocab_size=128256, max_position=4096,
                          tie_word_embeddings=True, dtype="bfloat16", rope_theta=500000.0),
    "llama3-8b": TinySpec(arch="llama", hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                          num_kv_heads=8, head_dim=128, vocab_size=128256, max_position=4096, dtype="bfloat16",
                          rope_theta=500000.0),
    # --smoke only: the CPU dry run's model. With the test models' 512-token vocabulary one short
    # greedy output once streamed no text at all, which the client counts as a failure; 2048 (the
    # CPU bench model's) did not.
    "tiny": TinySpec(arch="llama", hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, vocab_size=2048, max_position=512),
}
DEFAULT_MODELS = ("smollm2-135m", "llama3-1b")
CONCURRENCY = (1, 16, 64, 256)


@dataclass(frozen=True, slots=True)
class Load:
    """One workload for every concurrency: input/output tokens, and prompts per run by concurrency."""
    input_len: int = 512
    output_len: int = 64
    prompts_per_slot: int = 2      # num_prompts = max(min_prompts, prompts_per_slot * C)
    min_prompts: int = 8
    naive_requests: int = 4        # (a) measures this many one at a time and extrapolates
    dtype: str = "bfloat16"
    device: str = "cuda"
    serve_flags: tuple[str, ...] = ("--max-num-seqs", "256", "--max-num-batched-tokens", "8192",
                                    "--gpu-memory-utilization", "0.5")  # the other half: transformers

    def num_prompts(self, concurrency: int) -> int:
        return max(self.min_prompts, self.prompts_per_slot * concurrency)


SMOKE = Load(input_len=24, output_len=8, prompts_per_slot=2, min_prompts=4, naive_requests=2, dtype="float32",
             device="cpu", serve_flags=("--max-num-seqs", "8"))
SMOKE_CONCURRENCY = (1, 4)  # the eager pass (graphs off) then runs at C=1 only


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.gpu.gpu_serving", description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--models", nargs="+", default=None, choices=sorted(MODEL_SHAPES),
                   help=f"default {' '.join(DEFAULT_MODELS)} (--smoke: tiny)")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, help=f"default {CONCURRENCY}")
    p.add_argument("--budget-s", type=float, default=300.0, help="the whole stage, model writing included")
    p.add_argument("--model-cache", default=None, help="where the random models are written (default OUT_DIR/models)")
    p.add_argument("--model-repository", default=None,
                   help="kvserve serve's --model-repository (needed where kvserve is installed from a wheel: "
                        "the repository folder is not in it)")
    p.add_argument("--smoke", action="store_true", help="CPU dry run: the tiny model, concurrency 1 and 4")
    p.add_argument("--prepare-only", action="store_true",
                   help="only write the models into the cache and exit (gpu_check does this in the background "
                        "while the GPU runs the tests, so the serving budget is spent serving)")
    p.add_argument("--no-eager", action="store_true",
                   help="skip the --enforce-eager pass (CUDA graphs off) on the first model")
    return p.parse_args(argv)


def bench_command(model_dir: str, base_url: str, concurrency: int, load: Load, json_path: Path,
                  baselines: str) -> list[str]:
    return [sys.executable, "-m", "kvserve.frontend.cli", "bench", "--compare", "--compare-baselines", baselines,
            "--base-url", base_url, "--model", model_dir, "--dataset-name", "random",
            "--num-prompts", str(load.num_prompts(concurrency)), "--random-input-len", str(load.input_len),
            "--random-output-len", str(load.output_len), "--max-concurrency", str(concurrency),
            "--static-batch-size", str(concurrency), "--naive-max-requests", str(load.naive_requests),
            "--dtype", load.dtype, "--device", load.device, "--disable-tqdm", "--json", str(json_path)]


def summarize(doc: dict) -> dict:
    """The figures the issue asks for, out of one `kvserve bench --compare` document."""
    tput = {k: float(v["output_throughput"]) for k, v in doc["baselines"].items()}
    return {"output_tok_s": tput, "ratios": doc.get("ratios", {}),
            "failed": {k: int(v.get("failed", 0)) for k, v in doc["baselines"].items()}}


def _run(cmd: list[str], timeout: float, log_path: Path) -> dict:
    t = time.perf_counter()
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return {"rc": rc, "timed_out": rc is None, "seconds": round(time.perf_counter() - t, 1)}


def _serve_and_bench(label: str, model_dir: str, flags: list[str], load: Load, runs: dict[int, str], out: Path,
                     deadline: float, log_path: Path) -> dict:
    """One `kvserve serve`, warmed up, then one bench per concurrency C with baselines runs[C]."""
    from kvserve.loadtests.compare.baseline_kvserve import ServeProcess
    from kvserve.loadtests.compare import CompareUnavailable

    result: dict = {"serve_flags": flags, "runs": {}}
    t = time.perf_counter()
    try:
        server = ServeProcess(model_dir, flags, startup_timeout_s=max(10.0, deadline - time.monotonic()))
        with server:
            result["server_start_s"] = round(time.perf_counter() - t, 1)
            # Warm-up: Triton compiles each kernel variant on first use; no measured run should pay for it.
            warm = Load(**{**asdict(load), "input_len": 64, "output_len": 8})
            result["warmup"] = _run(bench_command(model_dir, server.base_url, max(runs), warm,
                                                  out / f"warmup_{label}.json", baselines="d"),
                                    max(1.0, deadline - time.monotonic()), log_path)
            for c, baselines in runs.items():
                left = deadline - time.monotonic()
                if left < 5:
                    result["runs"][str(c)] = {"skipped": "stage time budget spent"}
                    continue
                path = out / f"serve_{label}_c{c}.json"
                status = _run(bench_command(model_dir, server.base_url, c, load, path, baselines), left, log_path)
                if path.is_file():
                    status.update(summarize(json.loads(path.read_text())))
                result["runs"][str(c)] = status
            result["serve_log_tail"] = server.tail()
    except CompareUnavailable as exc:
        result["error"] = str(exc)
    return result


def run_model(name: str, spec: TinySpec, load: Load, concurrencies, out: Path, cache: Path, deadline: float,
              extra_flags: tuple[str, ...] = (), eager_concurrency: tuple[int, ...] = ()) -> dict:
    """The model's runs; then, for `eager_concurrency`, the server again with --enforce-eager (d only),
    so CUDA graphs on and off are compared on the same prompts (graphs_over_eager)."""
    t = time.perf_counter()
    model_dir = str(make_tiny_model(cache / name, spec))
    made = round(time.perf_counter() - t, 1)
    log_path = out / f"serve_{name}.log"
    flags = ["--dtype", load.dtype, *load.serve_flags, *extra_flags]
    # The eager pass gets a third of what is left, at most: it is the smaller question.
    eager_share = (deadline - time.monotonic()) / 3 if eager_concurrency else 0.0
    main_runs = {c: ("a,b,d" if c == 1 else "b,d") for c in concurrencies}
    result = {"model": name, "spec": asdict(spec), "make_model_s": made,
              **_serve_and_bench(name, model_dir, flags, load, main_runs, out, deadline - eager_share, log_path)}
    if eager_concurrency and "error" not in result:
        eager = _serve_and_bench(f"{name}_eager", model_dir, [*flags, "--enforce-eager"], load,
                                 {c: "d" for c in eager_concurrency}, out, deadline, log_path)
        result["eager"] = eager
        ratio = {}
        for c, r in eager["runs"].items():
            on = result["runs"].get(c, {}).get("output_tok_s", {}).get("d")
            off = r.get("output_tok_s", {}).get("d")
            ratio[c] = round(on / off, 3) if on and off else None
        result["graphs_over_eager"] = ratio
    return result


def main(argv=None) -> int:
    args = _parse(argv)
    load = SMOKE if args.smoke else Load()
    models = args.models or (["tiny"] if args.smoke else list(DEFAULT_MODELS))
    concurrencies = args.concurrency or list(SMOKE_CONCURRENCY if args.smoke else CONCURRENCY)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(args.model_cache) if args.model_cache else out / "models"
    if args.prepare_only:
        for name in models:
            t = time.perf_counter()
            make_tiny_model(cache / name, MODEL_SHAPES[name])  # idempotent: the serving run finds it made
            print(f"{name}: written in {time.perf_counter() - t:.1f}s", flush=True)
        return 0
    deadline = time.monotonic() + args.budget_s
    summary = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "smoke": args.smoke, "load": asdict(load),
               "concurrency": concurrencies, "budget_s": args.budget_s, "models": []}
    for i, name in enumerate(models):
        # Each model gets an even share of what is left, so a slow first model cannot starve the next.
        share = (deadline - time.monotonic()) / (len(models) - i)
        extra = ("--model-repository", args.model_repository) if args.model_repository else ()
        # Graphs on against off where launches weigh most: the first (smallest) model, low and mid concurrency.
        eager = tuple(c for c in concurrencies if c in (1, 64)) if i == 0 and not args.no_eager else ()
        summary["models"].append(run_model(name, MODEL_SHAPES[name], load, concurrencies, out, cache,
                                           time.monotonic() + share, extra, eager))
    (out / "serving.json").write_text(json.dumps(summary, indent=2))
    ok = all("error" not in m and all(r.get("rc") == 0 for r in m["runs"].values())
             and "error" not in m.get("eager", {}) for m in summary["models"])
    for m in summary["models"]:
        for c, r in m["runs"].items():
            tput = r.get("output_tok_s", {})
            print(f"{m['model']:<14} C={c:<4} " + "  ".join(f"({k}) {v:,.0f} tok/s" for k, v in tput.items())
                  + "  " + "  ".join(f"{k} {v:.2f}" for k, v in r.get("ratios", {}).items() if k.startswith("d_"))
                  + ("" if r.get("rc") == 0 else f"  [{r.get('skipped') or ('timed out' if r.get('timed_out') else 'rc=' + str(r.get('rc')))}]"))
        if m.get("graphs_over_eager"):
            print(f"{m['model']:<14} CUDA graphs on / off (--enforce-eager), (d) output tok/s: "
                  + "  ".join(f"C={c} {v}" for c, v in m["graphs_over_eager"].items()))
        for err in (m.get("error"), m.get("eager", {}).get("error")):
            if err:
                print(f"{m['model']}: {err[:2000]}")
    print(f"wrote {out / 'serving.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
