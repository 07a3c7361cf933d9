"""--tensor-parallel-size, --pipeline-parallel-size and --distributed-executor-backend on their way
in: the `kvserve serve` flags, their environment variables, config.pbtxt strings and EngineConfig."""
from __future__ import annotations

import pytest

from kvserve.backend.engine import EngineConfig
from kvserve.backend.triton.triton_model import engine_config_from_triton
from kvserve.frontend.cli.engine_flags import engine_env
from kvserve.frontend.cli.serve_cmd import build_parser


def test_serve_flags_travel_to_the_engine(llama_dir):
    args = build_parser().parse_args(["--tensor-parallel-size", "2", "--pipeline-parallel-size", "1",
                                      "--distributed-executor-backend", "mp"])
    env = engine_env(args)
    assert (env["KVSERVE_TENSOR_PARALLEL_SIZE"], env["KVSERVE_PIPELINE_PARALLEL_SIZE"],
            env["KVSERVE_DISTRIBUTED_EXECUTOR_BACKEND"]) == ("2", "1", "mp")
    config = EngineConfig.from_strings({"model": llama_dir, "tensor_parallel_size": "2",
                                        "distributed_executor_backend": "mp"})
    assert (config.tensor_parallel_size, config.distributed_executor_backend) == (2, "mp")
    for bad in (["--tensor-parallel-size", "0"], ["--distributed-executor-backend", "threads"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(bad)


def test_config_pbtxt_parameters_and_their_environment_override(llama_dir, monkeypatch):
    params = {"model": {"string_value": llama_dir}, "tensor_parallel_size": {"string_value": "4"},
              "distributed_executor_backend": {"string_value": ""}}
    config = engine_config_from_triton({"parameters": params})
    assert (config.tensor_parallel_size, config.distributed_executor_backend) == (4, None)
    monkeypatch.setenv("KVSERVE_TENSOR_PARALLEL_SIZE", "1")
    assert engine_config_from_triton({"parameters": params}).tensor_parallel_size == 1


def test_defaults_are_one_process(llama_dir):
    config = EngineConfig(model=llama_dir)
    assert (config.tensor_parallel_size, config.pipeline_parallel_size, config.distributed_executor_backend) == (1, 1, None)
