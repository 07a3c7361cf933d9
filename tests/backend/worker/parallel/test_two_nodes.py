"""Two "nodes" on this machine: the head's engine runs rank 0 and the other node's launcher (a
separate process tree, in its own session, started by the test and not by the head) runs rank 1;
they meet only through the TCP rendezvous on 127.0.0.1. Greedy tokens equal TP=1's; a node that
never comes, or comes for another world, fails the start with a message naming it; killing the
other node's tree mid-stream or while idle takes the engine down as a lost local worker does."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from kvserve.backend import LLM, SamplingParams
from kvserve.backend.engine import AsyncEngine, EngineConfig
from kvserve.backend.worker import WorkerLost
from kvserve.backend.worker.parallel.launch import build_parser, check
from kvserve.backend.worker.parallel.rendezvous import ranks_of_node
from kvserve.frontend.cli.engine_flags import engine_env
from kvserve.frontend.cli.serve_cmd import build_parser as serve_parser
from kvserve.frontend.cli.serve_cmd import main as serve_main
from tests.utils.processes import kill_process_group

pytestmark = pytest.mark.timeout(300)

ARGS = dict(max_model_len=256, num_kv_blocks=64)
PROMPTS = ["hello world", "a b c d e f g h", "the quick brown fox jumps"]
BOUND_S = 4.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(port: int, model: str, world_size: int = 2, node_rank: int = 1) -> subprocess.Popen:
    """The other node: its own session (process group), as a second machine's command would be."""
    return subprocess.Popen([sys.executable, "-m", "kvserve.backend.worker.parallel.launch", "--nnodes", "2",
                             "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                             "--world-size", str(world_size), "--model", model,
                             # One machine plays both nodes: this one leaves the head its cores.
                             "--cpu-reserved-cores", str(len(os.sched_getaffinity(0)) - 1)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _tree_pids(node: subprocess.Popen) -> list[int]:
    """The processes of the node's process group still alive (the launcher and its ranks)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.getpgid(int(entry)) == node.pid:
                pids.append(int(entry))
        except (ProcessLookupError, PermissionError):
            continue
    return pids


def test_each_node_runs_contiguous_ranks():
    assert [list(ranks_of_node(3, 2, n)) for n in range(2)] == [[0, 1], [2]]
    assert [list(ranks_of_node(4, 2, n)) for n in range(2)] == [[0, 1], [2, 3]]
    assert [list(ranks_of_node(5, 3, n)) for n in range(3)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="nnodes: 3 nodes for a world of 2"):
        ranks_of_node(2, 3, 0)


def test_bad_node_settings_are_refused_by_name(llama_dir):
    for kwargs, message in [(dict(nnodes=3, tensor_parallel_size=2), "nnodes: 3 nodes for a world of 2"),
                            (dict(nnodes=2, node_rank=2, tensor_parallel_size=2), r"node_rank: must be in \[0, nnodes=2\)"),
                            (dict(nnodes=2, node_rank=1, tensor_parallel_size=2), "runs `kvserve serve --headless"),
                            (dict(master_port=70000), "master_port"), (dict(nnodes=0), "nnodes")]:
        with pytest.raises(ValueError, match=message):
            EngineConfig(model=llama_dir, **kwargs)
    for argv, message in [(["--nnodes", "2", "--node-rank", "0"], "--node-rank: a headless node is one of 1..1"),
                          (["--nnodes", "1", "--node-rank", "0"], "--nnodes: a headless node is one of several"),
                          (["--nnodes", "2", "--node-rank", "1", "--master-port", "0"], "--master-port")]:
        args = build_parser().parse_args([*argv, "--master-addr", "127.0.0.1", "--world-size", "2"])
        with pytest.raises(ValueError, match=message):
            check(args)


def test_node_flags_travel_and_the_cli_refuses_what_cannot_work(llama_dir, capsys):
    args = serve_parser().parse_args(["--nnodes", "2", "--node-rank", "0", "--master-addr", "10.0.0.1",
                                      "--master-port", "29600", "--tensor-parallel-size", "3"])
    env = {k.removeprefix("KVSERVE_").lower(): v for k, v in engine_env(args).items()}
    config = EngineConfig.from_strings({**env, "model": llama_dir})
    assert (config.nnodes, config.node_rank, config.master_addr, config.master_port) == (2, 0, "10.0.0.1", 29600)
    for argv, message in [(["--nnodes", "2", "--node-rank", "1"], "--node-rank 1: only node 0 serves"),
                          (["--headless", "--nnodes", "2", "--node-rank", "1"], "--master-addr: a headless node"),
                          (["--headless", "--master-addr", "h", "--triton-url", "h:1"], "--triton-url has none")]:
        assert serve_main(["--model", llama_dir, *argv]) == 2
        assert message in capsys.readouterr().err


def test_tp2_across_two_nodes_equals_tp1(llama_dir):
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    expected = [o.outputs[0].token_ids for o in LLM(model=llama_dir, **ARGS).generate(PROMPTS, params)]
    port = _free_port()
    node = _node(port, llama_dir)  # before the head: it waits for the head's store
    try:
        llm = LLM(model=llama_dir, tensor_parallel_size=2, nnodes=2, master_addr="127.0.0.1", master_port=port, **ARGS)
        executor = llm.engine.runner.executor
        assert executor.procs == [] and executor.local_ranks == []  # the head started no worker itself
        assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)] == expected
        llm.engine.runner.close()
        assert node.wait(30) == 0  # the head's stop reaches the other node's ranks: its launcher exits 0
    finally:
        kill_process_group(node)


def test_a_node_that_never_comes_fails_the_start_with_its_command(llama_dir, monkeypatch):
    monkeypatch.setenv("KVSERVE_TP_START_TIMEOUT_S", "3")
    started = time.monotonic()
    with pytest.raises(WorkerLost, match=r"rank\(s\) \[1\] did not arrive within 3 s.*--headless --nnodes 2 "
                                         r"--node-rank K"):
        LLM(model=llama_dir, tensor_parallel_size=2, nnodes=2, master_port=_free_port(), **ARGS)
    assert time.monotonic() - started < 30


def test_a_node_started_for_another_world_is_refused(llama_dir, monkeypatch):
    monkeypatch.setenv("KVSERVE_TP_START_TIMEOUT_S", "120")  # a bound on failure; the refusal comes at once
    port = _free_port()
    node = _node(port, llama_dir, world_size=3)  # node 1 of a world of 3 runs rank 2; the head's world is 2
    try:
        with pytest.raises(WorkerLost, match="rank 2 refused: this node was started for a world of 3 rank"):
            LLM(model=llama_dir, tensor_parallel_size=2, nnodes=2, master_port=port, **ARGS)
        assert node.wait(30) != 0
        assert "rank 2 refused" in node.stderr.read()
    finally:
        kill_process_group(node)


@pytest.fixture()
def two_node_engine(llama_dir, monkeypatch):
    monkeypatch.setenv("KVSERVE_TP_STEP_TIMEOUT_S", str(BOUND_S))
    port = _free_port()
    node = _node(port, llama_dir)
    eng = AsyncEngine(EngineConfig(model=llama_dir, max_model_len=2048, num_kv_blocks=256, tensor_parallel_size=2,
                                   nnodes=2, master_port=port))
    eng.fatal = []
    eng.on_fatal = eng.fatal.append
    yield eng, node
    eng.shutdown()
    eng.engine.runner.close(graceful=False)
    kill_process_group(node)


def test_killing_the_other_node_mid_stream_stops_the_engine(two_node_engine):
    eng, node = two_node_engine
    outs = []
    eng.add_request("long", "a b c", SamplingParams(max_tokens=1900, temperature=0, ignore_eos=True), outs.append)
    deadline = time.monotonic() + 60
    while not outs and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outs, "no token before the fault"
    os.killpg(node.pid, signal.SIGKILL)
    deadline = time.monotonic() + BOUND_S + 10
    while not (outs and outs[-1].finished) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert outs[-1].finished and outs[-1].error and "parallel worker (tensor or pipeline) was lost" in outs[-1].error
    assert len(eng.fatal) == 1 and isinstance(eng.fatal[0], WorkerLost) and not eng.healthy()


def test_the_other_node_lost_while_idle_is_noticed_by_its_heartbeat(two_node_engine):
    eng, node = two_node_engine
    os.killpg(node.pid, signal.SIGKILL)
    started = time.monotonic()
    while not eng.fatal and time.monotonic() - started < BOUND_S + 10:
        time.sleep(0.05)
    assert eng.fatal and "heartbeat" in str(eng.fatal[0]) and not eng.healthy()


def test_the_head_lost_takes_the_other_node_down(two_node_engine):
    """The head's engine failing (here: it kills its ranks) leaves no rank running on the other node."""
    eng, node = two_node_engine
    eng.engine.runner.close(graceful=False)
    assert node.wait(BOUND_S + 10) != 0
    deadline = time.monotonic() + 10
    while _tree_pids(node) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _tree_pids(node), "a rank of the other node is left running"
