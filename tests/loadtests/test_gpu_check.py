"""The GPU check's CPU side: the wheel bundle's rules, the install into a stand-in of the GPU
machine, every stage's CPU fallback, and how the issue's targets are judged from the results."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from kvserve.loadtests.gpu import gpu_bundle
from kvserve.loadtests.gpu.gpu_check import junit_summary, targets

REPO = Path(__file__).resolve().parents[2]
MACHINE = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_machine": "x86_64", "implementation_name": "cpython", "platform_system": "Linux"}


def _needs(dist: str, extras: tuple[str, ...] = ()) -> set[str]:
    from importlib import metadata

    out = set()
    for raw in metadata.requires(dist) or []:
        req = Requirement(raw)
        if req.marker is None or any(req.marker.evaluate({**MACHINE, "extra": e}) for e in ("", *extras)):
            out.add(gpu_bundle.normalize(req.name))
    return out


def test_machine_image_plus_wheels_cover_kvserve_and_each_wheel():
    """A dependency added to pyproject (or a wheel's new need) without a wheel for it fails here."""
    from importlib import metadata

    pins = gpu_bundle.read_pins()
    bundled = {gpu_bundle.normalize(p.name): p for p in pins}
    machine = gpu_bundle.read_device_packages()
    have = machine | set(bundled)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {gpu_bundle.normalize(Requirement(r).name): r for r in project["dependencies"]}
    assert not {n for n in wanted if n not in have}, "kvserve needs these; neither the machine nor the bundle has them"
    for name, pin in bundled.items():
        assert not gpu_bundle.FORBIDDEN.match(name)
        # The wheels are the versions the tests here run with.
        assert metadata.version(pin.name) == pin.version, pin
        extras = ("grpc",) if name == "tritonclient" else ()
        missing = _needs(pin.name, extras) - have
        assert not missing, f"{pin.requirement} needs {missing}"
        # Only the conditional wheels may shadow a package the machine has.
        assert (name in machine) == (pin.only_if_not is not None), pin


def _wheels(tmp_path: Path, names: list[str], size: int = 10) -> Path:
    for n in names:
        (tmp_path / n).write_bytes(b"x" * size)
    return tmp_path


def _fake_bundle(tmp_path: Path) -> tuple[list[gpu_bundle.Pin], list[str]]:
    pins = [gpu_bundle.Pin("tritonclient", "2.73.0"), gpu_bundle.Pin("grpcio", "1.85.3", "grpcio >=1.81.1")]
    return pins, ["tritonclient-2.73.0-py3-none-any.whl", "grpcio-1.85.3-cp312-cp312-manylinux2014_x86_64.whl"]


def test_check_accepts_the_exact_bundle_and_names_every_fault(tmp_path):
    pins, names = _fake_bundle(tmp_path)
    good = tmp_path / "good"
    good.mkdir()
    report = gpu_bundle.check(_wheels(good, names), pins)
    assert report["wheels"] == 2 and report["total_bytes"] == 20
    bad = tmp_path / "bad"
    bad.mkdir()
    _wheels(bad, names[:1] + ["torch-2.11.0-cp312-cp312-linux_x86_64.whl", "tritonclient-2.72.0-py3-none-any.whl"])
    with pytest.raises(ValueError) as err:
        gpu_bundle.check(bad, pins)
    text = str(err.value)
    for fault in ("torch: must never travel", "tritonclient: 2 wheels", "grpcio==1.85.3: no wheel",
                  "torch: a wheel not in"):
        assert fault in text


def test_check_refuses_a_bundle_over_64_mib(tmp_path):
    pins, names = _fake_bundle(tmp_path)
    _wheels(tmp_path, names)
    with open(tmp_path / names[1], "r+b") as f:
        f.truncate(gpu_bundle.LIMIT_BYTES)  # sparse: no 64 MiB written
    with pytest.raises(ValueError, match="over the 64 MiB"):
        gpu_bundle.check(tmp_path, pins)


def test_select_keeps_the_machines_grpcio_only_when_recent_enough(tmp_path, monkeypatch):
    pins, names = _fake_bundle(tmp_path)
    _wheels(tmp_path, names)
    for have, installs in (("1.85.0", False), ("1.60.1", True), (None, True)):
        def version(name, have=have):
            if have is None:
                raise gpu_bundle.metadata.PackageNotFoundError(name)
            return have
        monkeypatch.setattr(gpu_bundle.metadata, "version", version)
        chosen, reasons = gpu_bundle.select(tmp_path, pins)
        assert (tmp_path / names[1] in chosen) is installs, (have, reasons)
        assert tmp_path / names[0] in chosen


def test_version_ranges():
    assert gpu_bundle.version_within("6.33.6", ">=6.33.5,<7")
    assert not gpu_bundle.version_within("7.0.1", ">=6.33.5,<7")
    assert not gpu_bundle.version_within("6.31.1", ">=6.33.5,<7")
    assert gpu_bundle.version_within("1.81.1", ">=1.81.1")
    assert gpu_bundle.version_within("2.11.0+cu130", "<2.12")


def test_read_pins_refuses_unpinned_lines(tmp_path):
    path = tmp_path / "w.txt"
    path.write_text("# a comment\nstructlog==26.1.0\ngrpcio==1.85.3 ; if-not grpcio >=1.81.1\n")
    assert gpu_bundle.read_pins(path)[1].only_if_not == "grpcio >=1.81.1"
    path.write_text("structlog>=26\n")
    with pytest.raises(ValueError, match="not pinned"):
        gpu_bundle.read_pins(path)


def test_junit_summary_counts_and_names_failures(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1" time="2.5">'
                   '<testcase classname="tests.kernels.t" name="ok"/>'
                   '<testcase classname="tests.kernels.t" name="bad"><failure message="assert 1 == 2">x</failure>'
                   '</testcase><testcase classname="tests.kernels.t" name="skip"><skipped/></testcase>'
                   '</testsuite></testsuites>')
    out = junit_summary(xml)
    assert (out["tests"], out["passed"], out["failures"], out["skipped"]) == (3, 1, 1, 1)
    assert out["failed"] == [{"test": "tests.kernels.t::bad", "message": ["assert 1 == 2"]}]
    assert "missing" in junit_summary(tmp_path / "none.xml")["junit"]


def _decode(batch, context, fraction, ratio):
    return {"batch": batch, "context": context, "fraction_of_copy": fraction, "paged_over_contiguous": ratio}


def _serve(c, a=None, b=1.0, d=2.0):
    tput = {"b": b, "d": d, **({"a": a} if a is not None else {})}
    return str(c), {"rc": 0, "output_tok_s": tput}


def test_targets_judge_each_figure():
    results = {
        "kernel_tests": {"ok": True, "passed": 56, "failures": 0, "errors": 0, "device": "cuda"},
        "kernel_bench": {"decode": [_decode(1, 1024, 0.2, 1.3), _decode(8, 8192, 0.75, 1.1),
                                    _decode(64, 32768, 0.9, 1.0)]},
        "serving": {"models": [{"model": "m", "runs": dict([_serve(1, a=10.0, b=12.0, d=15.0),
                                                            _serve(256, b=500.0, d=900.0)])}]},
    }
    t = targets(results)
    assert t["kernel_tests_pass"]["met"]
    assert t["decode_8k_plus_at_least_70pct_of_copy"]["met"]  # the 1k row's 20 % does not count
    assert not t["paged_at_most_1.25x_contiguous"]["met"]     # but its 1.3x does
    # The best concurrency's throughput against one request at a time: 900 / 10.
    assert t["m_serve_10x_one_at_a_time"] == {"met": True, "best_d_tok_s": 900.0, "a_tok_s": 10.0, "ratio": 90.0}
    assert t["m_serve_ahead_of_static_batch"]["met"]
    results["kernel_bench"]["decode"][1]["fraction_of_copy"] = 0.69
    results["serving"]["models"][0]["runs"]["256"]["output_tok_s"]["d"] = 400.0
    t = targets(results)
    assert not t["decode_8k_plus_at_least_70pct_of_copy"]["met"]
    assert not t["m_serve_ahead_of_static_batch"]["met"]
    # A concurrency that gave no figures (timed out) is not a pass.
    results["serving"]["models"][0]["runs"]["256"] = {"rc": None, "timed_out": True}
    assert not targets(results)["m_serve_ahead_of_static_batch"]["met"]


def test_script_parses():
    subprocess.run(["bash", "-n", str(REPO / "loadtests" / "gpu" / "gpu_check.sh")], check=True)


@pytest.mark.slow
def test_cpu_dry_run_of_every_stage(tmp_path):
    """gpu_check.py's stages on their CPU fallbacks, a few kernel and parity tests, the smoke serving run."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "kvserve.loadtests.gpu.gpu_check", str(out), "--repo", str(REPO),
           "--work", str(tmp_path / "work"), "--cpu", "--pytest-k",
           "rms_norm or (logits and llama and float32) or (test_greedy_with_speculation_equals_without and ngram)",
           "--budget", "kernel_tests=240", "parity=240", "engine_tests=240", "kernel_bench=120", "serving=300"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert files == ["engine_tests.json", "install.json", "kernel_bench.json", "kernel_tests.json", "logs.tar.gz",
                     "parity.json", "serving.json", "summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "cpu dry run" and summary["ok"]
    kernel = json.loads((out / "kernel_tests.json").read_text())
    assert kernel["TRITON_INTERPRET"] == "1" and kernel["passed"] >= 2 and kernel["failures"] == 0
    parity = json.loads((out / "parity.json").read_text())
    assert parity["passed"] >= 1 and parity["logit_tolerance_rel_l2"]["bfloat16"] > 0
    engine = json.loads((out / "engine_tests.json").read_text())
    assert engine["passed"] >= 1 and engine["failures"] == 0
    bench = json.loads((out / "kernel_bench.json").read_text())
    assert bench["smoke"] and len(bench["decode"]) == 4 and len(bench["kv_dtypes"]) == 3 * 4
    serving = json.loads((out / "serving.json").read_text())
    runs = serving["models"][0]["runs"]
    assert set(runs) == {"1", "4"} and all(r["rc"] == 0 and r["output_tok_s"]["d"] > 0 for r in runs.values())


@pytest.mark.slow
def test_install_into_a_stand_in_of_the_gpu_machine(tmp_path):
    """gpu_check.sh's install into a fresh venv that sees only the machine's packages: torch linked, not
    installed, and every kvserve module importable from the wheels. Needs pip to reach the index."""
    probe = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(tmp_path / "p"),
                            "structlog==26.1.0"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"pip cannot download here: {probe.stderr[-300:]}")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "loadtests" / "gpu" / "gpu_bundle.py"), "dry-run", str(out),
                           "--only", "install"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    install = json.loads((out / "install.json").read_text())
    assert install["ok"], install["problems"]
    assert "/image/torch/" in install["torch_file"] and not install["torch_file"].startswith(install["site"])
    assert any(name.startswith("kvserve-") for name in install["installed"])
    assert install["bundle"]["total_bytes"] < gpu_bundle.LIMIT_BYTES
