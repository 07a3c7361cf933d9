"""LoRA adapters in the Triton model: the modules loaded at start (--lora-modules), each
request's adapter resolved by name, and the control requests (list, load, unload) that the
gateway sends, since it never imports the engine (seam.tensors.LORA_CONTROL_PARAM).

The engine owns the adapters (AsyncEngine.add_lora / remove_lora / list_loras / resolve_lora,
all thread-safe); this module only turns names into LoRARequests, numbers them, and turns the
engine's LoRAError into the seam's errors: an unknown name is ErrorKind.NOT_FOUND (the client's
404 model_not_found, as for an unknown model), bad adapter files are INVALID (400).
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

from kvserve.backend.triton.model_tensors import request_parameter
from kvserve.seam import tensors as T
from kvserve.seam.error_wire import ErrorKind, RequestError
from kvserve.seam.limits import MAX_LORA_NAME_CHARS

log = logging.getLogger("kvserve.backend.lora")

# config.pbtxt parameters (and KVSERVE_<NAME> variables) that are the Triton model's, not
# EngineConfig fields: the engine takes adapters one at a time through add_lora.
MODEL_PARAMETERS = ("lora_modules", "allow_runtime_lora_updating")


@dataclass(frozen=True, slots=True)
class LoRAModule:
    name: str
    path: str
    base_model_name: str | None = None  # reported as the adapter's `parent` (default: the served model)


@dataclass(frozen=True, slots=True)
class LoRASettings:
    modules: tuple[LoRAModule, ...] = ()
    allow_runtime_updating: bool = False

    @classmethod
    def from_values(cls, values: dict[str, str]) -> LoRASettings:
        """From string values (config.pbtxt parameters over which KVSERVE_* variables win)."""
        allow = values.get("allow_runtime_lora_updating", "").strip().lower()
        if allow not in ("", "0", "1", "true", "false", "yes", "no", "on", "off"):
            raise ValueError(f"allow_runtime_lora_updating: cannot parse {allow!r} as a boolean")
        return cls(parse_lora_modules(values.get("lora_modules", "")), allow in ("1", "true", "yes", "on"))


def lora_settings_from_triton(model_config: dict) -> LoRASettings:
    """MODEL_PARAMETERS from config.pbtxt, overridden by KVSERVE_<NAME> (what kvserve serve sets)."""
    values = {k: v.get("string_value", "") for k, v in (model_config.get("parameters") or {}).items()
              if k in MODEL_PARAMETERS}
    values.update({name: os.environ[f"KVSERVE_{name.upper()}"] for name in MODEL_PARAMETERS
                   if f"KVSERVE_{name.upper()}" in os.environ})
    return LoRASettings.from_values(values)


def parse_lora_modules(text: str) -> tuple[LoRAModule, ...]:
    """`lora_modules`: a JSON list of {"name", "path", "base_model_name"?} (kvserve serve writes it
    from --lora-modules); empty: none."""
    if not text.strip():
        return ()
    try:
        items = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"lora_modules: not JSON ({exc.msg})") from None
    if not isinstance(items, list):
        raise ValueError("lora_modules: must be a JSON list of {\"name\", \"path\"} objects")
    modules, seen = [], set()
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not isinstance(item.get("path"), str):
            raise ValueError("lora_modules: each entry must be an object with string \"name\" and \"path\"")
        unknown = set(item) - {"name", "path", "base_model_name"}
        if unknown:
            raise ValueError(f"lora_modules: unknown key(s) {sorted(unknown)}")
        check_name(item["name"], "lora_modules")
        if item["name"] in seen:
            raise ValueError(f"lora_modules: adapter {item['name']!r} is given twice")
        seen.add(item["name"])
        base = item.get("base_model_name")
        modules.append(LoRAModule(item["name"], item["path"], base if isinstance(base, str) and base else None))
    return tuple(modules)


def check_name(name: str, param: str) -> None:
    if not name or len(name) > MAX_LORA_NAME_CHARS or name.strip() != name:
        raise RequestError(f"{param}: an adapter name must be 1-{MAX_LORA_NAME_CHARS} characters without surrounding "
                           "spaces", param)


class LoRAAdapters:
    """The Triton model's view of the engine's adapters; callable from any thread."""

    def __init__(self, engine, settings: LoRASettings, *, enabled: bool, base_model_name: str) -> None:
        self._engine = engine
        self.settings = settings
        self.enabled = enabled
        self._base = base_model_name
        self._ids = itertools.count(1)  # lora_int_id: > 0, never reused (the prefix-cache hash keys on it)
        self._parents: dict[str, str] = {}  # name -> base_model_name given with --lora-modules
        self._lock = threading.Lock()  # one load or unload at a time: check-then-add stays atomic

    def load_startup_modules(self) -> None:
        """--lora-modules: every one must load, else the model does not start (the error names it)."""
        if self.settings.modules and not self.enabled:
            raise ValueError("lora_modules: adapters need enable_lora (kvserve serve --enable-lora)")
        for module in self.settings.modules:
            try:
                self._load(module.name, module.path, module.base_model_name)
            except RequestError as exc:
                raise ValueError(f"lora_modules: adapter {module.name!r} ({module.path}): {exc}") from None
            log.info("LoRA adapter %s loaded from %s", module.name, module.path)

    # ---- requests -----------------------------------------------------------------------------
    def resolve(self, name: str):
        """The LoRARequest a generate request names; RequestError NOT_FOUND when unknown."""
        if not self.enabled:
            raise _not_found(name)
        from kvserve.backend.lora import LoRAError
        try:
            return self._engine.resolve_lora(name)
        except LoRAError as exc:
            raise _lora_error(exc, "model") from None

    # ---- control requests ---------------------------------------------------------------------
    def control(self, text: str) -> list[dict[str, Any]]:
        """One control request (seam.tensors.LORA_CONTROL_PARAM): the adapters served after it."""
        try:
            order = json.loads(text)
        except (json.JSONDecodeError, TypeError):
            raise RequestError(f"{T.LORA_CONTROL_PARAM}: not a JSON object", T.LORA_CONTROL_PARAM) from None
        if not isinstance(order, dict) or order.get("action") not in T.LORA_ACTIONS:
            raise RequestError(f"{T.LORA_CONTROL_PARAM}: action must be one of {', '.join(T.LORA_ACTIONS)}",
                               T.LORA_CONTROL_PARAM)
        action = order["action"]
        if action != "list":
            if not self.enabled:
                raise RequestError("LoRA adapters are not enabled on this server (start it with --enable-lora)",
                                   "lora_name")
            if not self.settings.allow_runtime_updating:
                raise RequestError("loading and unloading LoRA adapters at run time is off (start the server "
                                   "with --allow-runtime-lora-updating)", "lora_name")
            name = order.get("lora_name")
            if not isinstance(name, str):
                raise RequestError("lora_name: required (a string)", "lora_name")
            check_name(name, "lora_name")
            if action == "load":
                path = order.get("lora_path")
                if not isinstance(path, str) or not path:
                    raise RequestError("lora_path: required (the adapter's PEFT folder)", "lora_path")
                self._load(name, path, None)
                log.info("LoRA adapter %s loaded from %s at run time", name, path)
            else:
                self._unload(name)
                log.info("LoRA adapter %s unloaded", name)
        return self.listing()

    def listing(self) -> list[dict[str, Any]]:
        if not self.enabled:
            return []
        adapters = sorted(self._engine.list_loras(), key=lambda lora: lora.lora_int_id)
        return [{"name": lora.lora_name, "path": lora.lora_path, "parent": self._parents.get(lora.lora_name)}
                for lora in adapters]

    def _load(self, name: str, path: str, parent: str | None) -> None:
        from kvserve.backend.lora import LoRAError, LoRARequest
        with self._lock:
            if name == self._base:
                raise RequestError(f"lora_name: {name!r} is the base model's name", "lora_name")
            if any(lora.lora_name == name for lora in self._engine.list_loras()):
                raise RequestError(f"lora_name: the LoRA adapter {name!r} is already loaded (unload it first)",
                                   "lora_name")
            try:
                self._engine.add_lora(LoRARequest(name, next(self._ids), path))
            except LoRAError as exc:
                raise _lora_error(exc, "lora_path") from None
            if parent:
                self._parents[name] = parent

    def _unload(self, name: str) -> None:
        from kvserve.backend.lora import LoRAError
        with self._lock:
            try:
                self._engine.remove_lora(name)
            except LoRAError as exc:
                raise _lora_error(exc, "lora_name") from None
            self._parents.pop(name, None)


def _not_found(name: str) -> RequestError:
    return RequestError(f"model: no model or LoRA adapter is named {name[:MAX_LORA_NAME_CHARS]!r}", "model",
                        ErrorKind.NOT_FOUND)


def _lora_error(exc: Exception, param: str) -> RequestError:
    """The engine's LoRAError as the seam's error: its message names the problem (file, tensor, rank)."""
    return RequestError(str(exc), param, ErrorKind.NOT_FOUND if getattr(exc, "not_found", False) else ErrorKind.INVALID)


def lora_control_text(request) -> str | None:
    """The control order of a control request (seam.tensors.LORA_CONTROL_PARAM), else None."""
    value = request_parameter(request, T.LORA_CONTROL_PARAM)
    return value if isinstance(value, str) else None


def listing_text(adapters: list[dict[str, Any]]) -> str:
    return json.dumps({"adapters": adapters})
