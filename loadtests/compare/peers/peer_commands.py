"""Command lines of the peer harness: the three servers and the two clients.

Pure functions of the settings, so the tests can check every flag without
starting anything. The servers all answer to one served-model name, so both
clients send the same `model` to each of them.

vLLM-CPU's knobs, as vllm/envs.py, vllm/platforms/cpu.py, vllm/v1/worker/cpu_worker.py
and vllm/utils/ompmultiprocessing.py of 0.32.0 read them:
- VLLM_CPU_KVCACHE_SPACE: KV cache size in GiB. Unset, the worker reserves
  --gpu-memory-utilization (0.92) of the NUMA node's memory and refuses to start
  when that much is not free, which on a shared machine it is not; a fixed
  size also keeps runs comparable. 0 would mean 0 bytes, not the default.
- VLLM_CPU_OMP_THREADS_BIND: "auto" (default) pins one OpenMP thread per
  physical core of the node, minus the reserved cores; "nobind" leaves
  placement to the OS; "0-1"-style lists pin explicitly.
- VLLM_CPU_NUM_OF_RESERVED_CPU: cores "auto" leaves out of the OpenMP set for
  the API server and scheduler processes: at least one per worker on x86, so on
  2 cores vLLM computes on one by default.
- `--dtype float32`: with `auto`, vLLM downcasts a float32 checkpoint to the
  platform's first dtype, bfloat16 on x86 CPUs (even without bf16
  instructions); the comparison is in fp32, so it is asked for, as from kvserve.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvserve.loadtests.compare.peers.peer_install import VllmInstall

SERVERS = ("kvserve", "vllm", "llama.cpp")
CLIENTS = ("vllm-bench", "kvserve-bench")


@dataclass(frozen=True, slots=True)
class Workload:
    """One workload, spelled for both clients. `kind` is random or prefix:
    random prompts of input_len tokens, or num_prefixes shared prefixes of
    prefix_len tokens each followed by a suffix of input_len tokens."""

    name: str
    kind: str
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    num_warmups: int
    prefix_len: int = 0
    num_prefixes: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("random", "prefix"):
            raise ValueError(f"workload kind must be random or prefix, got {self.kind!r}")
        for name in ("input_len", "output_len", "concurrency", "num_prompts"):
            if getattr(self, name) < 1:
                raise ValueError(f"workload {self.name}: {name} must be >= 1")
        if self.num_warmups < 0:
            raise ValueError(f"workload {self.name}: num_warmups must be >= 0")
        if self.kind == "prefix":
            if self.prefix_len < 1 or self.num_prefixes < 1:
                raise ValueError(f"workload {self.name}: prefix_len and num_prefixes must be >= 1")
            if self.num_prompts % self.num_prefixes:
                # kvserve bench's shared-prefix dataset sends prefixes x questions prompts.
                raise ValueError(f"workload {self.name}: num_prompts {self.num_prompts} must be a multiple "
                                 f"of num_prefixes {self.num_prefixes}")

    @property
    def key(self) -> str:
        return f"{self.name}@c{self.concurrency}"

    @property
    def max_context(self) -> int:
        return self.prefix_len + self.input_len + self.output_len


def default_num_prompts(concurrency: int, scale: float = 1.0) -> int:
    """Enough prompts that the steady state dominates the ramp-up and the tail:
    four waves of the concurrency, at least 16 and at most 128 (the c=64 run
    would otherwise take longest of all on 2 cores), times `scale`."""
    return max(1, round(min(max(4 * concurrency, 16), 128) * scale))


def standard_workloads(concurrencies: tuple[int, ...] = (1, 16, 64), scale: float = 1.0,
                       prefix_concurrency: int = 16, warmups: int | None = None) -> list[Workload]:
    """Issue 17's grid: random 256 in / 128 out at each concurrency, and the
    shared-prefix check (4 prefixes of 512 tokens, 64-token suffixes, 32 out)."""
    out = [Workload("random-256-128", "random", 256, 128, c, default_num_prompts(c, scale),
                    c if warmups is None else warmups)
           for c in concurrencies]
    if prefix_concurrency > 0:
        n = max(4, 4 * round(default_num_prompts(prefix_concurrency, scale) / 4))
        out.append(Workload("prefix-4x512+64-32", "prefix", 64, 32, prefix_concurrency, n,
                            prefix_concurrency if warmups is None else warmups, prefix_len=512, num_prefixes=4))
    return out


@dataclass(frozen=True, slots=True)
class Settings:
    hf_model: Path  # HF folder: kvserve and vLLM serve it; both clients tokenize with it
    gguf_model: Path | None  # llama-server serves this file (None: llama.cpp not run)
    kvserve_model: Path | None = None  # what kvserve serves, when not hf_model (its GGUF loading, say)
    served_name: str = "smollm2"
    threads: int = 2  # compute threads each server may use
    vllm_kvcache_gib: int = 4
    vllm_omp_bind: str = "auto"
    vllm_reserved_cpus: int | None = None
    llama_ctx_per_slot: int = 1024
    seed: int = 0
    dtype: str = "float32"
    kvserve_args: tuple[str, ...] = ()
    vllm_args: tuple[str, ...] = ()
    llama_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Command:
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # set on top of the harness's environment
    unset: tuple[str, ...] = ()  # removed from it
    pythonpath: tuple[str, ...] = ()  # put before the harness's PYTHONPATH


def kvserve_server(s: Settings, port: int, kvserve_bin: str) -> Command:
    """kvserve serve with its defaults but the dtype and the KV cache budget (vLLM's, so that
    neither server preempts where the other does not): the whole HTTP + gRPC + engine path."""
    return Command([kvserve_bin, "serve", "--model", str(s.kvserve_model or s.hf_model), "--host", "127.0.0.1",
                    "--port", str(port), "--served-model-name", s.served_name, "--dtype", s.dtype,
                    "--kv-cache-memory", f"{s.vllm_kvcache_gib}GiB", "--seed", str(s.seed), *s.kvserve_args])


def vllm_server(s: Settings, port: int, inst: VllmInstall) -> Command:
    env = {"VLLM_CPU_KVCACHE_SPACE": str(s.vllm_kvcache_gib), "VLLM_CPU_OMP_THREADS_BIND": s.vllm_omp_bind}
    if s.vllm_reserved_cpus is not None:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(s.vllm_reserved_cpus)
    return Command(
        [str(inst.python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(s.hf_model),
         "--served-model-name", s.served_name, "--host", "127.0.0.1", "--port", str(port),
         "--dtype", s.dtype, "--seed", str(s.seed), *s.vllm_args],
        env,
        # The stub must never reach the server (module docstring of peer_install).
        unset=("PYTHONPATH",),
    )


def llama_server(s: Settings, port: int, binary: Path, parallel: int) -> Command:
    """llama-server splits -c between its --parallel slots, so the total is per-slot x slots."""
    parallel = max(1, parallel)
    return Command([str(binary), "-m", str(s.gguf_model), "--alias", s.served_name, "--host", "127.0.0.1",
                    "--port", str(port), "--parallel", str(parallel), "-t", str(s.threads),
                    "-c", str(s.llama_ctx_per_slot * parallel), "--seed", str(s.seed), *s.llama_args])


def server_command(server: str, s: Settings, port: int, *, kvserve_bin: str, vllm: VllmInstall | None,
                   llama_bin: Path | None, parallel: int) -> Command:
    if server == "kvserve":
        return kvserve_server(s, port, kvserve_bin)
    if server == "vllm":
        assert vllm is not None
        return vllm_server(s, port, vllm)
    if server == "llama.cpp":
        assert llama_bin is not None
        return llama_server(s, port, llama_bin, parallel)
    raise ValueError(f"unknown server {server!r}; choose from {', '.join(SERVERS)}")


def vllm_bench_command(s: Settings, w: Workload, base_url: str, inst: VllmInstall, result: Path) -> Command:
    """`vllm bench serve` on the completions endpoint, run from the vLLM venv
    with the dist-info stub on its path (the command needs distribution `vllm`)."""
    data = ["--dataset-name", "random", "--random-input-len", str(w.input_len),
            "--random-output-len", str(w.output_len), "--random-range-ratio", "0"]
    if w.kind == "prefix":
        data = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(w.prefix_len),
                "--prefix-repetition-suffix-len", str(w.input_len),
                "--prefix-repetition-num-prefixes", str(w.num_prefixes),
                "--prefix-repetition-output-len", str(w.output_len)]
    argv = [str(inst.venv / "bin" / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", base_url,
            "--endpoint", "/v1/completions", "--model", s.served_name, "--tokenizer", str(s.hf_model),
            *data, "--num-prompts", str(w.num_prompts), "--max-concurrency", str(w.concurrency),
            "--num-warmups", str(w.num_warmups), "--ignore-eos", "--seed", str(s.seed),
            # Greedy, as kvserve bench sends: vllm bench 0.32 no longer sets temperature 0 itself,
            # and each server's default sampling would then differ.
            "--temperature", "0",
            "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99",
            "--save-result", "--result-dir", str(result.parent), "--result-filename", result.name,
            "--disable-tqdm"]
    return Command(argv, pythonpath=(str(inst.stub_dir),))


def kvserve_bench_command(s: Settings, w: Workload, base_url: str, python: str, result: Path) -> Command:
    """`kvserve bench`, counting tokens with the HF folder's tokenizer so every
    server gets the very same prompt texts."""
    data = ["--dataset-name", "random", "--random-input-len", str(w.input_len),
            "--random-output-len", str(w.output_len)]
    if w.kind == "prefix":
        data = ["--dataset-name", "shared-prefix", "--shared-prefix-num-prefixes", str(w.num_prefixes),
                "--shared-prefix-questions-per-prefix", str(w.num_prompts // w.num_prefixes),
                "--shared-prefix-prefix-len", str(w.prefix_len), "--shared-prefix-question-len", str(w.input_len),
                "--shared-prefix-output-len", str(w.output_len)]
    else:
        data += ["--num-prompts", str(w.num_prompts)]
    argv = [python, "-m", "kvserve.loadtests.bench.bench_cli", "--base-url", base_url, "--model", s.served_name,
            "--tokenizer", str(s.hf_model), *data, "--max-concurrency", str(w.concurrency),
            "--num-warmups", str(w.num_warmups), "--ignore-eos", "--seed", str(s.seed),
            "--json", str(result), "--disable-tqdm"]
    return Command(argv)


def client_command(client: str, s: Settings, w: Workload, base_url: str, *, vllm: VllmInstall | None,
                   python: str, result: Path) -> Command:
    if client == "vllm-bench":
        assert vllm is not None
        return vllm_bench_command(s, w, base_url, vllm, result)
    if client == "kvserve-bench":
        return kvserve_bench_command(s, w, base_url, python, result)
    raise ValueError(f"unknown client {client!r}; choose from {', '.join(CLIENTS)}")
