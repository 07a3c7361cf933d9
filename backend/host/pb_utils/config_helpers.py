"""Model-config helpers of pb_utils and the ModelConfig object of auto_complete_config."""
from __future__ import annotations

import copy
import json
from typing import Any


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("input", []):
        if properties.get("name") == name:
            return properties
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("output", []):
        if properties.get("name") == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    policy = model_config.get("model_transaction_policy")
    return bool(policy.get("decoupled", False)) if policy else False


def get_input_tensor_by_name(inference_request: Any, name: str) -> Any:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: Any, name: str) -> Any:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


class ModelConfig:
    """The object passed to, and returned by, `TritonPythonModel.auto_complete_config`."""

    def __init__(self, model_config: str) -> None:
        self._model_config: dict[str, Any] = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self._model_config)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        current = int(self._model_config.get("max_batch_size", 0))
        if current > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {current}, but in auto-complete-config "
                f"function for model '{self._model_config.get('name', '')}' specified max_batch_size "
                f"{max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config "
                    f"function for model '{self._model_config.get('name', '')}' tries to set "
                    "scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        unknown = set(transaction_policy_dict) - {"decoupled"}
        if unknown:
            raise ValueError(f"model transaction property in auto-complete-config function contains {unknown}")
        wanted = bool(transaction_policy_dict.get("decoupled", False))
        policy = self._model_config.get("model_transaction_policy")
        # Only a policy written in config.pbtxt is binding; auto-complete may not flip it.
        if policy is not None and bool(policy.get("decoupled", False)) != wanted:
            raise ValueError(
                "trying to change decoupled property in auto-complete-config for model "
                f"'{self._model_config.get('name', '')}', which is initially set to "
                f"'{bool(policy.get('decoupled', False))}'."
            )
        self._model_config["model_transaction_policy"] = {"decoupled": wanted}

    def add_input(self, input: dict[str, Any]) -> None:  # noqa: A002 - Triton's name
        self._add_io("input", input)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add_io("output", output)

    def _add_io(self, kind: str, io: dict[str, Any]) -> None:
        model = self._model_config.get("name", "")
        allowed = {"name", "data_type", "dims", "optional"}
        extra = set(io) - allowed
        if extra:
            raise ValueError(f"{kind} '{io.get('name')}' in auto-complete-config function for model "
                             f"'{model}' contains property other than 'name', 'data_type' and 'dims'.")
        for required in ("name", "data_type", "dims"):
            if required not in io:
                raise ValueError(f"{kind} in auto-complete-config function for model '{model}' is "
                                 f"missing '{required}' property.")
        entries = self._model_config.setdefault(kind, [])
        for current in entries:
            if current.get("name") != io["name"]:
                continue
            if current.get("data_type", "TYPE_INVALID") not in ("TYPE_INVALID", io["data_type"]):
                raise ValueError(f"unable to load model '{model}', configuration expects datatype "
                                 f"{current['data_type']} for {kind} '{io['name']}', model provides "
                                 f"{io['data_type']}")
            if current.get("dims") and list(current["dims"]) != list(io["dims"]):
                raise ValueError(f"model '{model}', tensor '{io['name']}': the model expects dims "
                                 f"{io['dims']} but the model configuration specifies dims {current['dims']}")
            current.update(io)
            return
        entries.append(dict(io))
