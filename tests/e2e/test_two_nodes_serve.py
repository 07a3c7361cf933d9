"""SmolLM2-135M-Instruct at TP=3 across two "nodes" on this machine, through `kvserve serve` and the
openai client: the head (`--nnodes 2 --node-rank 0`) runs the API and ranks 0-1, and a second process
tree that the test starts on its own (`kvserve serve --headless --node-rank 1`, its own session) runs
rank 2; they meet only through the TCP rendezvous on 127.0.0.1. The answers equal TP=1's (greedy),
and killing the second tree mid-stream ends the stream with an error and the head exits non-zero,
with no rank left running. (That the head's orderly stop reaches the other node, which then exits 0,
is tests/backend/worker/parallel/test_two_nodes.py's, on the tiny model.)"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_tensor_parallel_serve import QUESTIONS, WORKER, _client, _serve
from tests.serve_process import REPO
from tests.utils.processes import kill_process_group

openai = pytest.importorskip("openai")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

MODEL = "SmolLM2-135M-Instruct"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _nodes(port: int) -> list[str]:
    return ["--tensor-parallel-size", "3", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(port)]


def _second_node(port: int) -> subprocess.Popen:
    """The other node's command, as a second machine would run it: not a child of the head."""
    # --cpu-reserved-cores 1: this "node" shares the machine with the head; alone it would take every core.
    return subprocess.Popen([sys.executable, "-m", "kvserve.frontend.cli", "serve", *_nodes(port), "--node-rank", "1",
                             "--headless", "--cpu-reserved-cores", str(len(os.sched_getaffinity(0)) - 1)], cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _ranks(port: int) -> list[int]:
    """The worker processes of this world (by its port: other tests' workers may run beside it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0") if proc.name.isdigit() else []
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in cmdline]
        if WORKER in args and args[args.index("--master-port") + 1] == str(port):
            pids.append(int(proc.name))
    return pids


def _answers(client) -> list[str]:
    # Two short answers: enough to see every rank's shard at work, in the few minutes CI can spare.
    return [client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": q}], temperature=0,
                                           max_tokens=32).choices[0].message.content for q in QUESTIONS[:2]]


def test_tp3_across_two_nodes_answers_as_tp1_and_dies_with_the_other_node(real_model_path):
    with _serve([]) as (_, line):
        expected = _answers(_client(line))
    port = _free_port()
    node = _second_node(port)
    try:
        with _serve([*_nodes(port), "--node-rank", "0"], check_exit=False) as (head, line):
            assert len(_ranks(port)) == 2  # rank 1 under the head, rank 2 under the other node
            client = _client(line)
            assert _answers(client) == expected
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tell me a long story."}], stream=True,
                max_tokens=400, temperature=0)
            chunks = iter(stream)
            next(chunks)
            os.killpg(node.pid, signal.SIGKILL)
            with pytest.raises(openai.APIError):
                for _ in chunks:
                    pass
            assert head.wait(timeout=60) != 0
    finally:
        kill_process_group(node)
    deadline = time.monotonic() + 10
    while _ranks(port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _ranks(port), "a rank is left running"
