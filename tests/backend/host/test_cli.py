"""The host as a process: `python -m kvserve.backend.host`, its ready line,
SIGTERM shutdown and --parent-pid."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from host_fixtures import http_get

from kvserve.backend.host.parent_watch import process_alive
from kvserve.backend.host.server import main

HOST_CMD = [sys.executable, "-m", "kvserve.backend.host"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_line(proc: subprocess.Popen[str], timeout: float = 30.0) -> str:
    """One stdout line, without hanging the test if the host never prints it."""
    import selectors  # noqa: PLC0415

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            proc.kill()
            stderr = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"no ready line within {timeout}s; stderr: {stderr}")
    return proc.stdout.readline()


def start_host_process(repo: Path, *extra: str) -> tuple[subprocess.Popen[str], int, int]:
    grpc_port, metrics_port = free_port(), free_port()
    proc = subprocess.Popen([*HOST_CMD, "--model-repository", str(repo), "--grpc-port", str(grpc_port),
                             "--metrics-port", str(metrics_port), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, grpc_port, metrics_port


def wait_gone(pid: int, timeout: float) -> float:
    start = time.monotonic()
    while process_alive(pid):
        if time.monotonic() - start > timeout:
            raise AssertionError(f"process {pid} still alive after {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - start


def test_module_entry_point_ready_line_serving_and_sigterm(healthy_repo: Path) -> None:
    proc, grpc_port, metrics_port = start_host_process(healthy_repo)
    try:
        line = read_line(proc)
        assert line == f"kvserve-host ready grpc=127.0.0.1:{grpc_port} metrics=127.0.0.1:{metrics_port}\n"
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert client.is_server_ready()  # every model of this repository loaded
        inputs = [grpcclient.InferInput("INPUT0", [4], "FP32"), grpcclient.InferInput("INPUT1", [4], "FP32")]
        for i in inputs:
            i.set_data_from_numpy(np.full(4, 2.0, np.float32))
        assert list(client.infer("add_sub", inputs).as_numpy("OUTPUT0")) == [4.0] * 4
        client.close()
        assert http_get(f"http://127.0.0.1:{metrics_port}/v2/health/ready")[0] == 200
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert out == ""  # the ready line was the only line on stdout...
    assert "add_sub prints to stdout" in err  # ...because what models print goes to stderr
    assert "add_sub finalize called" in err  # models were finalized on the way out


def test_parent_pid_that_dies_stops_the_host(healthy_repo: Path) -> None:
    # The watched process is not the host's parent: the poll has to notice it.
    sleeper = subprocess.Popen(["sleep", "60"])
    proc, _, _ = start_host_process(healthy_repo, "--parent-pid", str(sleeper.pid))
    try:
        assert read_line(proc).startswith("kvserve-host ready ")
        sleeper.kill()
        sleeper.wait()
        assert proc.wait(timeout=10) == 0
    finally:
        for p in (sleeper, proc):
            if p.poll() is None:
                p.kill()


def test_child_host_dies_with_the_cli_that_started_it(healthy_repo: Path) -> None:
    # A stand-in CLI starts the host with --parent-pid of itself and is then SIGKILLed:
    # no chance to clean up, so the host must notice on its own (PR_SET_PDEATHSIG / poll).
    launcher = textwrap.dedent(f"""
        import os, subprocess, sys, time
        host = subprocess.Popen({HOST_CMD!r} + ["--model-repository", {str(healthy_repo)!r},
                                "--grpc-port", "0", "--metrics-port", "0", "--parent-pid", str(os.getpid())],
                                stdout=subprocess.PIPE, text=True)
        print(host.pid, host.stdout.readline().strip(), flush=True)
        time.sleep(120)
    """)
    cli = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    host_pid = 0
    try:
        first = read_line(cli, timeout=30).split(" ", 1)
        host_pid = int(first[0])
        assert first[1].startswith("kvserve-host ready grpc=127.0.0.1:")
        cli.send_signal(signal.SIGKILL)
        cli.wait()
        assert wait_gone(host_pid, timeout=10) < 10
    finally:
        if cli.poll() is None:
            cli.kill()
        if host_pid and process_alive(host_pid):
            os.kill(host_pid, signal.SIGKILL)


def test_bad_repository_fails_fast(tmp_path: Path) -> None:
    done = subprocess.run([*HOST_CMD, "--model-repository", str(tmp_path / "missing"), "--grpc-port", "0",
                           "--metrics-port", "0"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert done.stdout == ""  # no ready line when nothing is served
    assert "is not a directory" in done.stderr


def test_a_model_that_fails_to_load_stops_the_host_unless_told_otherwise() -> None:
    # tritonserver's --exit-on-error (default true): a parent waiting for the ready line gets an
    # exit code and the reason, not a server that answers "not ready" forever.
    from host_fixtures import BASIC  # noqa: PLC0415  (has a model whose initialize() raises)

    done = subprocess.run([*HOST_CMD, "--model-repository", str(BASIC), "--grpc-port", "0", "--metrics-port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stdout == ""
    assert "initialize failed on purpose" in done.stderr and "exiting: failing failed to load" in done.stderr
    proc, _, _ = start_host_process(BASIC, "--exit-on-error=false")
    try:
        assert read_line(proc, 60).startswith("kvserve-host ready")  # the other models are served
    finally:
        proc.terminate()
        proc.wait(30)


def test_kvserve_triton_subcommand_dispatches_here() -> None:
    from kvserve.frontend.cli.commands import SUBCOMMANDS  # noqa: PLC0415

    module = __import__(SUBCOMMANDS["triton"][0], fromlist=["main"])
    assert module.main is main


def test_sigterm_while_a_model_is_still_loading(tmp_path: Path) -> None:
    # A parent that dies during a long model load must not leave the host behind.
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text('backend: "python"\n')
    (tmp_path / "slow" / "1" / "model.py").write_text(textwrap.dedent("""
        import time
        class TritonPythonModel:
            def initialize(self, args):
                print("slow model loading", flush=True)
                time.sleep(60)
            def execute(self, requests):
                return None
    """))
    proc, _, _ = start_host_process(tmp_path)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # ends at EOF if the host died instead
            if "slow model loading" in line:
                break
        else:
            raise AssertionError("the slow model never started loading")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and out == ""


def _free_pair() -> int:
    """A port N with N + 1 free too."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise AssertionError("no two consecutive free ports")


def test_metrics_port_defaults_to_grpc_port_plus_one_and_a_taken_port_exits_1(healthy_repo: Path) -> None:
    # The gateway's --triton-url assumes metrics on the gRPC port + 1: two hosts started with
    # only --grpc-port once both wanted 8002, and the second lost (its metrics, or its start).
    grpc_port = _free_pair()
    first = subprocess.Popen([*HOST_CMD, "--model-repository", str(healthy_repo), "--grpc-port", str(grpc_port)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = read_line(first)
        assert line == f"kvserve-host ready grpc=127.0.0.1:{grpc_port} metrics=127.0.0.1:{grpc_port + 1}\n"
        assert http_get(f"http://127.0.0.1:{grpc_port + 1}/v2/health/live")[0] == 200
        # Same gRPC port again: refused (gRPC's SO_REUSEPORT had let it share the port silently).
        # Another gRPC port whose metrics port is taken: refused too. Each says why, exit 1.
        cases = ((["--grpc-port", str(grpc_port), "--metrics-port", "0"], f"gRPC to 127.0.0.1:{grpc_port}"),
                 (["--grpc-port", str(free_port()), "--metrics-port", str(grpc_port + 1)],
                  f"metrics to 127.0.0.1:{grpc_port + 1}"))
        for args, reason in cases:
            second = subprocess.run([*HOST_CMD, "--model-repository", str(healthy_repo), *args],
                                    capture_output=True, text=True, timeout=60)
            assert second.returncode == 1, (args, second.stderr[-2000:])
            assert second.stdout == ""
            assert f"cannot bind {reason}" in second.stderr, second.stderr[-2000:]
        assert first.poll() is None  # the first host serves on
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=20)
