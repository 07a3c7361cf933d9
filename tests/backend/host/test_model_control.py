"""RepositoryModelLoad / RepositoryModelUnload (tritonserver's explicit model control) through the
real tritonclient.grpc client: refused in mode none; in explicit mode a load serves, a reload
swaps, a failed reload leaves the serving model alone, an unload finalizes and forgets."""
from __future__ import annotations

import shutil
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from host_fixtures import BASIC, HostThread, metric_value, metrics_text
from tritonclient.utils import InferenceServerException

from kvserve.backend.host.server import _load_models, build_parser

# A toy model that says which generation of its config it runs (GEN), can be asked to take its
# time (DELAY_MS), and logs initialize, finalize and slow executes to a file beside its config.
GEN_CONFIG = """
name: "gen"
backend: "python"
max_batch_size: 0
input [ {{ name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "GEN" data_type: TYPE_STRING dims: [ 1 ] }} ]
parameters: {{ key: "generation" value: {{ string_value: "{generation}" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""
GEN_MODEL = textwrap.dedent("""
    import json
    import time
    from pathlib import Path

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.generation = config["parameters"]["generation"]["string_value"]
            if self.generation == "broken":
                raise RuntimeError("generation 'broken' refuses to initialize")
            self.log = Path(args["model_repository"]) / "lifecycle.log"
            self._note("initialize")  # first: an instance counts as alive from here on
            time.sleep(0.1)  # long enough for concurrent loads to overlap if nothing serialized them

        def execute(self, requests):
            responses = []
            for request in requests:
                delay_ms = pb_utils.get_input_tensor_by_name(request, "DELAY_MS").as_numpy()[0]
                if delay_ms:
                    self._note("execute")
                    time.sleep(delay_ms / 1000)
                gen = pb_utils.Tensor("GEN", np.array([self.generation.encode()], dtype=np.object_))
                responses.append(pb_utils.InferenceResponse(output_tensors=[gen]))
            return responses

        def finalize(self):
            self._note("finalize")

        def _note(self, event):
            with self.log.open("a") as f:
                f.write(f"{event} {self.generation}\\n")
""")
POLLING_ENABLED = "explicit model load / unload is not allowed if polling is enabled"


def _write_gen(repo: Path, generation: str = "1") -> Path:
    model_dir = repo / "gen"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(GEN_CONFIG.format(generation=generation))
    (model_dir / "1" / "model.py").write_text(GEN_MODEL)
    return model_dir


def _lifecycle(repo: Path) -> list[str]:
    log = repo / "gen" / "lifecycle.log"
    return log.read_text().splitlines() if log.exists() else []


def _delay(delay_ms: int) -> grpcclient.InferInput:
    delay = grpcclient.InferInput("DELAY_MS", [1], "INT32")
    delay.set_data_from_numpy(np.array([delay_ms], dtype=np.int32))
    return delay


def _generation(client: grpcclient.InferenceServerClient, delay_ms: int = 0) -> str:
    return client.infer("gen", [_delay(delay_ms)]).as_numpy("GEN")[0].decode()


def _index(client: grpcclient.InferenceServerClient) -> dict[str, tuple[str, str, str]]:
    return {m.name: (m.version, m.state, m.reason) for m in client.get_model_repository_index().models}


def _status_of(call) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value.status(), err.value.message()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """echo and failing from the basic repository, and the toy `gen`."""
    root = tmp_path / "repo"
    root.mkdir()
    for name in ("echo", "failing"):
        shutil.copytree(BASIC / name, root / name)
    _write_gen(root)
    return root


@pytest.fixture
def explicit_host(repo: Path) -> Iterator[HostThread]:
    """--model-control-mode=explicit --load-model=echo: gen and failing are in the repository, not loaded."""
    ht = HostThread(repo, load_models=frozenset({"echo"}))
    yield ht
    ht.stop()


@pytest.fixture
def client(explicit_host: HostThread) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(explicit_host.handle.grpc_url)
    yield c
    c.close()


def test_mode_none_refuses_load_and_unload(repo: Path) -> None:
    shutil.rmtree(repo / "failing")
    ht = HostThread(repo)  # load_models=None: tritonserver's --model-control-mode=none
    c = grpcclient.InferenceServerClient(ht.handle.grpc_url)
    try:
        for call in (lambda: c.load_model("gen"), lambda: c.unload_model("echo"), lambda: c.load_model("nope")):
            assert _status_of(call) == ("StatusCode.UNAVAILABLE", POLLING_ENABLED)
        assert c.is_model_ready("echo") and c.is_model_ready("gen")  # nothing was unloaded
    finally:
        c.close()
        ht.stop()


def test_explicit_mode_with_every_model_loaded_still_allows_control(repo: Path) -> None:
    # `--model-control-mode=explicit --load-model '*'` loads everything (load_models None) and,
    # unlike mode none, still lets clients unload and load.
    args = build_parser().parse_args(["--model-repository", str(repo), "--model-control-mode", "explicit",
                                      "--load-model", "*"])
    assert _load_models(args) is None
    shutil.rmtree(repo / "failing")
    ht = HostThread(repo, load_models=None, explicit_model_control=True)
    c = grpcclient.InferenceServerClient(ht.handle.grpc_url)
    try:
        c.unload_model("gen")
        assert not c.is_model_ready("gen")
        c.load_model("gen")
        assert _generation(c) == "1"
    finally:
        c.close()
        ht.stop()


def test_load_serves_and_unload_finalizes_and_forgets(explicit_host: HostThread, repo: Path,
                                                      client: grpcclient.InferenceServerClient) -> None:
    assert _index(client)["gen"] == ("", "", "") and not client.is_model_ready("gen")
    client.load_model("gen")
    assert client.is_model_ready("gen") and _generation(client) == "1"
    assert _index(client)["gen"] == ("1", "READY", "")
    assert client.is_server_ready()  # strict readiness counts only the loaded models

    client.unload_model("gen")
    assert not client.is_model_ready("gen")
    status, message = _status_of(lambda: _generation(client))
    assert status == "StatusCode.NOT_FOUND" and "unknown model" in message
    assert _index(client)["gen"] == ("1", "UNAVAILABLE", "unloaded")  # as tritonserver lists it
    assert _lifecycle(repo) == ["initialize 1", "finalize 1"]  # finalize() ran on unload
    assert client.is_server_ready() and client.is_model_ready("echo")

    client.unload_model("gen")  # not loaded: success, as tritonserver
    client.unload_model("no_such_model")  # not in the repository: success too
    client.load_model("gen")  # loaded again in the same process
    assert _generation(client) == "1" and _index(client)["gen"] == ("1", "READY", "")


def test_metrics_follow_a_model_through_unload_and_load_again(explicit_host: HostThread,
                                                              client: grpcclient.InferenceServerClient) -> None:
    labels = {"model": "gen", "version": "1"}
    client.load_model("gen")
    _generation(client)
    # >= 1: the metric store is the process's, shared with the hosts of earlier tests.
    assert metric_value(metrics_text(explicit_host.handle), "nv_inference_request_success", **labels) >= 1
    client.unload_model("gen")
    # As tritonserver, whose metric reporter goes with the model: the series leave /metrics...
    assert 'model="gen"' not in metrics_text(explicit_host.handle)
    client.load_model("gen")  # ...and come back at 0 when it loads again (no duplicate registration)
    text = metrics_text(explicit_host.handle)
    assert 'nv_inference_request_success{model="gen",version="1"} 0' in text
    assert 'nv_inference_request_failure{model="gen",reason="BACKEND",version="1"} 0' in text
    _generation(client)
    assert metric_value(metrics_text(explicit_host.handle), "nv_inference_request_success", **labels) == 1


def test_load_of_a_name_not_in_the_repository_is_invalid(explicit_host: HostThread, repo: Path,
                                                          client: grpcclient.InferenceServerClient) -> None:
    _write_gen(repo.parent / "outside")  # a valid model beside the repository, never to be reached
    (repo / "no_config").mkdir()
    for name in ("nope", "..", ".", "", "../outside/gen", "gen/1", "/etc", "no_config"):
        status, message = _status_of(lambda: client.load_model(name))
        assert status == "StatusCode.INVALID_ARGUMENT", name
        assert message == f"failed to load '{name}', failed to poll from model repository"
        client.unload_model(name)  # nothing to unload: success, and nothing touched
    assert not (repo.parent / "outside" / "gen" / "lifecycle.log").exists()
    assert set(_index(client)) == {"echo", "failing", "gen"}
    # A config sent with the request would be tritonserver's override: refused, never ignored.
    status, message = _status_of(lambda: client.load_model("gen", config='{"max_batch_size": 8}'))
    assert status == "StatusCode.UNIMPLEMENTED" and "not supported" in message
    assert not client.is_model_ready("gen")


def test_a_failed_reload_leaves_the_serving_model_alone(explicit_host: HostThread, repo: Path,
                                                        client: grpcclient.InferenceServerClient) -> None:
    client.load_model("gen")
    config = repo / "gen" / "config.pbtxt"
    for broken, reason in ((GEN_CONFIG.format(generation="broken"), "generation 'broken' refuses to initialize"),
                           ("this is { not a config", "failed to parse")):
        config.write_text(broken)
        status, message = _status_of(lambda: client.load_model("gen"))
        assert status == "StatusCode.INTERNAL" and "failed to load 'gen'" in message and reason in message
        assert client.is_model_ready("gen") and _generation(client) == "1"  # still the good one
        assert _index(client)["gen"] == ("1", "READY", "")
    assert _lifecycle(repo) == ["initialize 1"]  # the serving instance was never finalized
    assert client.is_server_ready()


def test_a_failed_first_load_is_shown_failed_until_unloaded(explicit_host: HostThread,
                                                            client: grpcclient.InferenceServerClient) -> None:
    status, message = _status_of(lambda: client.load_model("failing"))
    assert status == "StatusCode.INTERNAL" and "initialize failed on purpose" in message
    version, state, reason = _index(client)["failing"]
    assert state == "UNAVAILABLE" and "initialize failed on purpose" in reason
    assert not client.is_model_ready("failing") and not client.is_server_ready()  # as a failed start-up load
    client.unload_model("failing")
    # it never served, so it is listed by name alone again, not as "unloaded"
    assert _index(client)["failing"] == ("", "", "") and client.is_server_ready()


def test_a_reload_that_drops_a_version_shows_it_unloaded(explicit_host: HostThread, repo: Path,
                                                         client: grpcclient.InferenceServerClient) -> None:
    client.load_model("gen")
    (repo / "gen" / "2").mkdir()
    shutil.copy(repo / "gen" / "1" / "model.py", repo / "gen" / "2" / "model.py")
    client.load_model("gen")  # the default version policy serves the latest version only
    rows = sorted((m.version, m.state, m.reason) for m in client.get_model_repository_index().models
                  if m.name == "gen")
    assert rows == [("1", "UNAVAILABLE", "unloaded"), ("2", "READY", "")]
    assert client.is_model_ready("gen", "2") and not client.is_model_ready("gen", "1")
    status, message = _status_of(lambda: client.infer("gen", [_delay(0)], model_version="1"))
    assert (status, message) == ("StatusCode.UNAVAILABLE",
                                 "Request for unknown model: 'gen' version 1 is not at ready state")


def test_reload_swaps_after_the_queued_requests_finish(explicit_host: HostThread, repo: Path,
                                                       client: grpcclient.InferenceServerClient) -> None:
    client.load_model("gen")
    slow: list[str] = []
    in_flight = threading.Thread(target=lambda: slow.append(_generation(client, delay_ms=400)))
    in_flight.start()
    deadline = time.monotonic() + 10
    while "execute 1" not in _lifecycle(repo) and time.monotonic() < deadline:
        time.sleep(0.01)
    _write_gen(repo, generation="2")
    client.load_model("gen")  # returns once the old runtime has finished its request and finalized
    in_flight.join(10)
    assert slow == ["1"]  # the request already with the old version completed on it
    assert _generation(client) == "2"
    # The new version was ready before the old one was shut down.
    assert _lifecycle(repo) == ["initialize 1", "execute 1", "initialize 2", "finalize 1"]


def test_concurrent_loads_of_one_model_take_turns(explicit_host: HostThread, repo: Path,
                                                  client: grpcclient.InferenceServerClient) -> None:
    errors: list[BaseException] = []

    def load() -> None:
        try:
            client.load_model("gen")
        except BaseException as exc:  # noqa: BLE001  (reported by the assertion below)
            errors.append(exc)

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and _generation(client) == "1"
    # One at a time: each load initialized beside the one generation it replaces, never more (three
    # loads at once would hold three copies of a model in memory).
    events = _lifecycle(repo)
    alive = peak = 0
    for event in events:
        alive += 1 if event.startswith("initialize") else -1
        peak = max(peak, alive)
    assert events.count("initialize 1") == 3 and peak == 2 and alive == 1
    client.unload_model("gen")
    assert _lifecycle(repo).count("finalize 1") == 3  # no instance was left behind


def test_a_load_whose_client_gives_up_still_completes(explicit_host: HostThread, repo: Path,
                                                      client: grpcclient.InferenceServerClient) -> None:
    # The client's deadline cancels the RPC, not the load: no instance initialized and then orphaned.
    status, _ = _status_of(lambda: client.load_model("gen", client_timeout=0.02))
    assert status == "StatusCode.DEADLINE_EXCEEDED"
    deadline = time.monotonic() + 10
    while not client.is_model_ready("gen") and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _generation(client) == "1"
    client.unload_model("gen")
    assert _lifecycle(repo) == ["initialize 1", "finalize 1"]


# ---- the same from inside a model: pb_utils.load_model / unload_model (the BLS model-loading API) ----

MANAGER_CONFIG = """
name: "manager"
backend: "python"
max_batch_size: 0
input [ { name: "ACTION" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "TARGET" data_type: TYPE_STRING dims: [ 1 ] },
        { name: "CONFIG" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "STATUS" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""
# Does ACTION to TARGET and answers what pb_utils said, with the target's readiness right after.
MANAGER_MODEL = textwrap.dedent("""
    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                action, target, config = (pb_utils.get_input_tensor_by_name(request, name).as_numpy()[0].decode()
                                          for name in ("ACTION", "TARGET", "CONFIG"))
                try:
                    if action == "load":
                        pb_utils.load_model(target, config=config)
                    else:
                        pb_utils.unload_model(target)
                    status = f"ok ready={pb_utils.is_model_ready(target)}"
                except pb_utils.TritonModelException as exc:
                    status = f"error {exc}"
                out = pb_utils.Tensor("STATUS", np.array([status.encode()], dtype=np.object_))
                responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            return responses
""")


def _ask_manager(client: grpcclient.InferenceServerClient, action: str, target: str, config: str = "") -> str:
    inputs = []
    for name, value in (("ACTION", action), ("TARGET", target), ("CONFIG", config)):
        tensor = grpcclient.InferInput(name, [1], "BYTES")
        tensor.set_data_from_numpy(np.array([value.encode()], dtype=np.object_))
        inputs.append(tensor)
    return client.infer("manager", inputs).as_numpy("STATUS")[0].decode()


def _with_manager(repo: Path) -> Path:
    (repo / "manager" / "1").mkdir(parents=True)
    (repo / "manager" / "config.pbtxt").write_text(MANAGER_CONFIG)
    (repo / "manager" / "1" / "model.py").write_text(MANAGER_MODEL)
    return repo


def test_a_model_loads_and_unloads_another_through_pb_utils(repo: Path) -> None:
    ht = HostThread(_with_manager(repo), load_models=frozenset({"manager"}))
    c = grpcclient.InferenceServerClient(ht.handle.grpc_url)
    try:
        assert _ask_manager(c, "load", "gen") == "ok ready=True"  # returns once it serves
        assert _generation(c) == "1"
        _write_gen(repo, generation="2")
        assert _ask_manager(c, "load", "gen") == "ok ready=True" and _generation(c) == "2"  # a reload
        # unload returns once the model takes no new requests; it finalizes after
        assert _ask_manager(c, "unload", "gen") == "ok ready=False"
        assert _index(c)["gen"] == ("1", "UNAVAILABLE", "unloaded")
        deadline = time.monotonic() + 10
        while _lifecycle(repo).count("finalize 2") < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _lifecycle(repo) == ["initialize 1", "initialize 2", "finalize 1", "finalize 2"]

        status = _ask_manager(c, "load", "failing")
        assert status.startswith("error ") and "initialize failed on purpose" in status
        assert _ask_manager(c, "load", "nope") == "error failed to load 'nope', failed to poll from model repository"
        # a config would be tritonserver's override: refused, never ignored
        assert "not supported" in _ask_manager(c, "load", "gen", config='{"max_batch_size": 8}')
        assert not c.is_model_ready("gen")
        # its own load or unload would wait on the thread that asks: refused, and it keeps serving
        assert _ask_manager(c, "unload", "manager") == "error failed to unload 'manager': a model cannot unload itself"
        assert _ask_manager(c, "load", "manager") == "error failed to load 'manager': a model cannot load itself"
        assert c.is_model_ready("manager")
        # a client's RPC and the model's call take turns on the same model
        assert _ask_manager(c, "load", "gen") == "ok ready=True"
        c.unload_model("gen")
        assert _ask_manager(c, "unload", "gen") == "ok ready=False"  # nothing left to unload: success
    finally:
        c.close()
        ht.stop()


def test_mode_none_refuses_pb_utils_model_control_as_the_rpcs(repo: Path) -> None:
    shutil.rmtree(repo / "failing")
    ht = HostThread(_with_manager(repo))
    c = grpcclient.InferenceServerClient(ht.handle.grpc_url)
    try:
        assert _ask_manager(c, "load", "gen") == f"error {POLLING_ENABLED}"
        assert _ask_manager(c, "unload", "echo") == f"error {POLLING_ENABLED}"
        assert c.is_model_ready("echo") and c.is_model_ready("gen")
    finally:
        c.close()
        ht.stop()
