"""config.pbtxt -> the ModelConfig protobuf, normalised, and the JSON Triton gives models.

Parsing uses the real `model_config_pb2.ModelConfig` with text_format, never a
hand-written parser. The JSON is produced the way tritonserver's
ModelConfigToJson does it: proto field names, default-valued fields printed,
then the int64/uint64 fields that protobuf renders as strings turned back into
numbers (so `dims` is `[4]`, not `["4"]`, and `parameters` reads
`{"key": {"string_value": "..."}}`).
"""
from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any, Callable

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

PYTHON_BACKEND = "python"
DEFAULT_MODEL_FILENAME = "model.py"


class ConfigError(Exception):
    """The model cannot be loaded because of its configuration or layout."""


def parse_config_file(path: str | os.PathLike[str]) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(Path(path).read_text(encoding="utf-8"), config)
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise ConfigError(f"failed to parse {path}: {exc}") from exc
    return config


def gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        return len(ids)
    return len(glob.glob("/dev/nvidia[0-9]*"))


def normalize(config: mc.ModelConfig, model_dir: Path) -> mc.ModelConfig:
    """Fill the defaults tritonserver fills before a model sees its config."""
    out = mc.ModelConfig()
    out.CopyFrom(config)
    if not out.name:
        out.name = model_dir.name
    if not out.backend and not out.platform:
        out.backend = PYTHON_BACKEND
    if out.backend != PYTHON_BACKEND:
        raise ConfigError(
            f"unsupported backend '{out.backend or out.platform}': the embedded host runs only "
            "Python-backend models"
        )
    if not out.HasField("version_policy"):
        out.version_policy.latest.num_versions = 1
    if not out.instance_group:
        out.instance_group.add()
    gpus = gpu_count()
    for index, group in enumerate(out.instance_group):
        if not group.name:
            group.name = f"{out.name}_{index}"
        if group.count < 1:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU if gpus else mc.ModelInstanceGroup.KIND_CPU
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
            group.gpus.extend(range(max(gpus, 1)))
    return out


def model_filename(config: mc.ModelConfig) -> str:
    return config.default_model_filename or DEFAULT_MODEL_FILENAME


def select_versions(model_dir: Path, config: mc.ModelConfig) -> list[int]:
    """Numbered subfolders holding the model file, filtered by version_policy."""
    filename = model_filename(config)
    available = sorted(
        int(p.name) for p in model_dir.iterdir()
        if p.is_dir() and p.name.isdigit() and (p / filename).is_file()
    )
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return available
    if which == "specific":
        wanted = set(policy.specific.versions)
        return [v for v in available if v in wanted]
    count = policy.latest.num_versions if which == "latest" and policy.latest.num_versions > 0 else 1
    return available[-count:]


def is_decoupled(config: mc.ModelConfig) -> bool:
    return bool(config.model_transaction_policy.decoupled)


def instance_kind_name(kind: int) -> str:
    # TRITONSERVER_InstanceGroupKindString: what models see in args["model_instance_kind"].
    return {mc.ModelInstanceGroup.KIND_AUTO: "AUTO", mc.ModelInstanceGroup.KIND_GPU: "GPU",
            mc.ModelInstanceGroup.KIND_CPU: "CPU", mc.ModelInstanceGroup.KIND_MODEL: "MODEL"}[kind]


def _message_to_dict(config: mc.ModelConfig) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"preserving_proto_field_name": True}
    try:  # protobuf >= 5.26 renamed including_default_value_fields
        text = json_format.MessageToJson(config, always_print_fields_with_no_presence=True, **kwargs)
    except TypeError:
        text = json_format.MessageToJson(config, including_default_value_fields=True, **kwargs)
    return json.loads(text)


def _ints(obj: dict[str, Any], key: str) -> None:
    if key in obj:
        obj[key] = [int(v) for v in obj[key]]


def _int(obj: dict[str, Any], key: str) -> None:
    if key in obj:
        obj[key] = int(obj[key])


def _each(obj: dict[str, Any], key: str, fix: Callable[[dict[str, Any]], None]) -> None:
    value = obj.get(key)
    for item in (value.values() if isinstance(value, dict) else value or []):
        fix(item)


def _fix_int64_fields(d: dict[str, Any]) -> None:
    # The same fields tritonserver's ModelConfigToJson converts back to numbers.
    def io(x: dict[str, Any]) -> None:
        _ints(x, "dims")
        if "reshape" in x:
            _ints(x["reshape"], "shape")

    _each(d, "input", io)
    _each(d, "output", io)
    if "specific" in d.get("version_policy", {}):
        _ints(d["version_policy"]["specific"], "versions")
    if "dynamic_batching" in d:
        db = d["dynamic_batching"]
        for key in ("max_queue_delay_microseconds", "priority_levels", "default_priority_level"):
            _int(db, key)
        if "default_queue_policy" in db:
            _int(db["default_queue_policy"], "default_timeout_microseconds")
        _each(db, "priority_queue_policy", lambda p: _int(p, "default_timeout_microseconds"))
    if "sequence_batching" in d:
        sb = d["sequence_batching"]
        _int(sb, "max_sequence_idle_microseconds")
        for strategy in ("oldest", "direct"):
            if strategy in sb:
                _int(sb[strategy], "max_queue_delay_microseconds")
        _each(sb, "state", lambda s: (_ints(s, "dims"), _each(s, "initial_state", lambda i: _ints(i, "dims"))))
    if "ensemble_scheduling" in d:
        _each(d["ensemble_scheduling"], "step", lambda s: _int(s, "model_version"))
    _each(d, "model_warmup", lambda w: _each(w, "inputs", lambda i: _ints(i, "dims")))


def config_to_dict(config: mc.ModelConfig) -> dict[str, Any]:
    d = _message_to_dict(config)
    _fix_int64_fields(d)
    return d


def config_to_json(config: mc.ModelConfig) -> str:
    """args["model_config"], compact like tritonserver's writer."""
    return json.dumps(config_to_dict(config), separators=(",", ":"))


def config_from_dict(d: dict[str, Any]) -> mc.ModelConfig:
    """Back from the dict auto_complete_config returns."""
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(d, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"auto_complete_config returned an invalid configuration: {exc}") from exc
    return config
