"""config.pbtxt parsing, the JSON models receive, version selection and load failures."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest

from kvserve.backend.host.host_metrics import HostMetrics
from kvserve.backend.host.model_config import (
    ConfigError, config_to_json, is_decoupled, normalize, parse_config_file, select_versions,
)
from kvserve.backend.host.model_runtime import ModelState
from kvserve.backend.host.repository import ModelRepository

from host_fixtures import BASIC

REAL_LLM_CONFIG = Path(__file__).resolve().parents[3] / "model_repository" / "llm" / "config.pbtxt"


def test_model_config_json_has_tritons_shape() -> None:
    config = normalize(parse_config_file(BASIC / "echo" / "config.pbtxt"), BASIC / "echo")
    d = json.loads(config_to_json(config))
    assert d["parameters"] == {"greeting": {"string_value": "hello"}}
    assert d["input"][0]["dims"] == [-1]  # int64 rendered as numbers, not protobuf's strings
    assert d["input"][0]["data_type"] == "TYPE_STRING"
    assert d["max_batch_size"] == 0  # default-valued fields are printed, as tritonserver prints them
    assert d["instance_group"] == [{"name": "echo_0", "count": 1, "kind": "KIND_CPU", "gpus": [],
                                    "secondary_devices": [], "profile": [], "passive": False, "host_policy": ""}]
    assert d["version_policy"] == {"latest": {"num_versions": 1}}
    assert d["backend"] == "python"
    assert "model_transaction_policy" not in d


def test_real_llm_config_parses() -> None:
    if not REAL_LLM_CONFIG.is_file():
        pytest.skip("model_repository/llm/config.pbtxt not present")
    config = normalize(parse_config_file(REAL_LLM_CONFIG), REAL_LLM_CONFIG.parent)
    assert is_decoupled(config)
    d = json.loads(config_to_json(config))
    assert d["model_transaction_policy"] == {"decoupled": True}
    assert all(isinstance(v["string_value"], str) for v in d["parameters"].values())
    assert {i["name"] for i in d["input"]} >= {"text_input", "sampling_parameters"}


def _write_model(root: Path, name: str, config: str, versions: dict[str, str | None]) -> Path:
    model = root / name
    model.mkdir()
    (model / "config.pbtxt").write_text(textwrap.dedent(config))
    for version, source in versions.items():
        (model / version).mkdir()
        if source is not None:
            (model / version / "model.py").write_text(textwrap.dedent(source))
    return model


TRIVIAL = """
    import triton_python_backend_utils as pb_utils
    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
"""


@pytest.mark.parametrize("policy, expected", [
    ("", [2]),
    ("version_policy: { latest: { num_versions: 2 } }", [1, 2]),
    ("version_policy: { specific: { versions: [1] } }", [1]),
    ("version_policy: { all: {} }", [1, 2]),
])
def test_version_selection(tmp_path: Path, policy: str, expected: list[int]) -> None:
    # Version 3 has no model.py, so it is never a candidate.
    model = _write_model(tmp_path, "m", f'backend: "python"\n{policy}\n', {"1": TRIVIAL, "2": TRIVIAL, "3": None})
    config = normalize(parse_config_file(model / "config.pbtxt"), model)
    assert select_versions(model, config) == expected


def test_non_python_backend_is_rejected(tmp_path: Path) -> None:
    model = _write_model(tmp_path, "onnx", 'platform: "onnxruntime_onnx"\n', {"1": None})
    with pytest.raises(ConfigError, match="only Python-backend"):
        normalize(parse_config_file(model / "config.pbtxt"), model)


def test_bad_models_do_not_take_others_down(tmp_path: Path) -> None:
    shutil.copytree(BASIC / "add_sub", tmp_path / "add_sub")
    shutil.copytree(BASIC / "failing", tmp_path / "failing")
    _write_model(tmp_path, "garbled", "this is not { a config", {"1": TRIVIAL})
    _write_model(tmp_path, "noversion", 'backend: "python"\n', {"1": None})
    _write_model(tmp_path, "importerror", 'backend: "python"\n', {"1": "raise ImportError('no such dep')\n"})
    repo = ModelRepository(tmp_path, HostMetrics())
    repo.scan()
    repo.load_all()
    try:
        assert repo.model_ready("add_sub") and not repo.all_ready()
        states = {name: (state, reason) for name, _, state, reason in repo.index()}
        assert states["add_sub"][0] == "READY"
        assert "initialize failed on purpose" in states["failing"][1]
        assert "failed to parse" in states["garbled"][1]
        assert "at least one version" in states["noversion"][1]
        assert "ImportError: no such dep" in states["importerror"][1]
        assert all(states[n][0] == "UNAVAILABLE" for n in ("failing", "garbled", "noversion", "importerror"))
    finally:
        repo.shutdown()


def test_explicit_control_lists_the_models_it_did_not_load_by_name(tmp_path: Path) -> None:
    # tritonserver's index: "every model available in a model repository, even if not loaded"
    shutil.copytree(BASIC / "add_sub", tmp_path / "add_sub")
    shutil.copytree(BASIC / "failing", tmp_path / "failing")
    (tmp_path / "not_a_model").mkdir()  # no config.pbtxt: not a model
    repo = ModelRepository(tmp_path, HostMetrics())
    repo.scan(only=frozenset({"add_sub", "absent"}))
    try:
        rows = {row[0]: row for row in repo.index()}
        assert set(rows) == {"add_sub", "absent", "failing"}
        assert rows["failing"] == ("failing", "", "", "")  # by name alone: no version, no state
        assert rows["absent"][2] == "UNAVAILABLE" and rows["add_sub"][1] == "1"
        assert set(repo.entries) == {"add_sub", "absent"}  # a model not loaded is not looked up or awaited
    finally:
        repo.shutdown()


def test_auto_complete_config_and_initialize_args(tmp_path: Path) -> None:
    source = """
        import json
        import triton_python_backend_utils as pb_utils
        SEEN = []
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(config):
                config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [2]})
                config.add_output({"name": "Y", "data_type": "TYPE_INT32", "dims": [2]})
                config.set_model_transaction_policy({"decoupled": True})
                return config
            def initialize(self, args):
                SEEN.append(dict(args))
                self.args = args
            def execute(self, requests):
                return None
    """
    _write_model(tmp_path, "auto", 'backend: "python"\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n',
                 {"1": source})
    repo = ModelRepository(tmp_path, HostMetrics())
    repo.scan()
    repo.load_all()
    try:
        runtime = repo.lookup("auto")
        assert runtime.state == ModelState.READY and runtime.decoupled
        assert [i.name for i in runtime.config.input] == ["X"]
        args = runtime._instances[0].initialize_args()
        assert set(args) == {"model_config", "model_instance_kind", "model_instance_name",
                             "model_instance_device_id", "model_repository", "model_version", "model_name"}
        assert sorted(i.initialize_args()["model_instance_name"] for i in runtime._instances) == \
            ["auto_0_0", "auto_0_1"]
        assert args["model_instance_kind"] == "CPU" and args["model_version"] == "1"
        assert args["model_repository"] == str(tmp_path.resolve() / "auto")
        assert json.loads(args["model_config"])["input"][0]["dims"] == [2]
    finally:
        repo.shutdown()
