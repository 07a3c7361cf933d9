"""The model repository: which models and versions exist, their load state, lookups.

Models load in parallel; one failing (bad config, no version, initialize
raising) is reported as not ready with a reason and never stops the others.
"""
from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from .infer_errors import InferError
from .host_metrics import HostMetrics
from .model_config import ConfigError, normalize, parse_config_file, select_versions
from .model_runtime import ModelRuntime, ModelState
from .pb_utils.triton_errors import TritonError

_LOG = logging.getLogger("kvserve.host")
CONFIG_FILE = "config.pbtxt"
_INT64_MAX = 2**63 - 1  # model versions are int64 in tritonserver


@dataclass(slots=True)
class ModelEntry:
    name: str
    model_dir: Path
    config: mc.ModelConfig | None = None
    versions: dict[int, ModelRuntime] = field(default_factory=dict)
    error: str = ""  # a failure before any version could be tried

    def ready_versions(self) -> list[int]:
        return sorted(v for v, rt in self.versions.items() if rt.state == ModelState.READY)


def parse_version(version: str) -> int:
    """A request's model version string as a number; INVALID_ARG otherwise. The message is
    tritonserver's without the string itself: a client's bytes are never repeated back."""
    # "-1", "abc", "1.0", " 1" and "²" are refused, and so is anything past an int64 (Python's
    # own conversion error, beyond 4300 digits, was an UNKNOWN quoting the limit).
    if not (version.isascii() and version.isdigit()) or len(version) > 19 or int(version) > _INT64_MAX:
        raise InferError(TritonError.INVALID_ARG,
                         "failed to get model version from specified version string, "
                         "version should be an integral value > 0")
    return int(version)


class ModelRepository:
    def __init__(self, root: str | Path, metrics: HostMetrics) -> None:
        self.root = Path(root).resolve()
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository '{self.root}' is not a directory")
        self.metrics = metrics
        self.entries: dict[str, ModelEntry] = {}
        # Models in the repository that explicit model control did not load: the index lists them
        # by name alone, as tritonserver's does ("every model available ... even if not loaded").
        self.not_loaded: list[str] = []

    def scan(self, only: frozenset[str] | None = None) -> None:
        """Find the models; with `only` (explicit model control) just those, and a name
        that is not in the repository is a failed model, as tritonserver reports it."""
        found = set()
        for model_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            if not (model_dir / CONFIG_FILE).is_file():
                continue
            if only is not None and model_dir.name not in only:
                self.not_loaded.append(model_dir.name)
                continue
            found.add(model_dir.name)
            entry = ModelEntry(model_dir.name, model_dir)
            self.entries[entry.name] = entry
            try:
                config = normalize(parse_config_file(model_dir / CONFIG_FILE), model_dir)
                entry.config = config
                versions = select_versions(model_dir, config)
                if not versions:
                    raise ConfigError(f"at least one version must be available under the version policy of "
                                      f"model '{entry.name}'")
                for v in versions:
                    entry.versions[v] = ModelRuntime(name=entry.name, version=v, model_dir=model_dir,
                                                     config=config, metrics=self.metrics)
            except ConfigError as exc:
                entry.error = str(exc)
                _LOG.error("failed to load '%s': %s", entry.name, exc)
        for name in sorted((only or set()) - found):
            self.entries[name] = ModelEntry(name, self.root / name, error="failed to poll from model repository")
            _LOG.error("failed to load '%s': not found in the model repository", name)

    def load_all(self) -> None:
        runtimes = [rt for e in self.entries.values() for rt in e.versions.values()]
        if not runtimes:
            return
        with ThreadPoolExecutor(max_workers=min(8, len(runtimes)), thread_name_prefix="kvserve-load") as pool:
            list(pool.map(ModelRuntime.load, runtimes))

    def lookup(self, name: str, version: str = "") -> ModelRuntime:
        """The runtime that serves (name, version); "" means the latest ready version."""
        entry = self.entries.get(name)
        if entry is None:
            raise InferError(TritonError.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        if not version:
            ready = entry.ready_versions()
            if not ready:
                raise InferError(TritonError.UNAVAILABLE,
                                 f"Request for unknown model: '{name}' has no available versions")
            return entry.versions[ready[-1]]
        number = parse_version(version)
        runtime = entry.versions.get(number)
        if runtime is None:
            raise InferError(TritonError.NOT_FOUND,
                             f"Request for unknown model: '{name}' version {number} is not found")
        if runtime.state != ModelState.READY:
            raise InferError(TritonError.UNAVAILABLE,
                             f"Request for unknown model: '{name}' version {number} is not at ready state")
        return runtime

    def model_ready(self, name: str, version: str = "") -> bool:
        """Loaded and, when the model defines `is_model_ready()`, ready by its own account."""
        try:
            return self.lookup(name, version).user_ready()
        except InferError:
            return False

    def all_ready(self) -> bool:
        """tritonserver's strict readiness: every model in the repository is ready."""
        return all(e.versions and not e.error and all(rt.state == ModelState.READY for rt in e.versions.values())
                   for e in self.entries.values())

    def index(self) -> list[tuple[str, str, str, str]]:
        rows = []
        for entry in self.entries.values():
            if not entry.versions:
                rows.append((entry.name, "", ModelState.UNAVAILABLE.value, entry.error))
            for v, rt in sorted(entry.versions.items()):
                rows.append((entry.name, str(v), rt.state.value, rt.reason))
        rows.extend((name, "", "", "") for name in self.not_loaded)
        return sorted(rows)

    def shutdown(self, timeout: float = 30.0) -> None:
        for entry in self.entries.values():
            for rt in entry.versions.values():
                rt.shutdown(timeout)
