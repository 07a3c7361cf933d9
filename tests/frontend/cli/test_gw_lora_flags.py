"""`kvserve serve`'s LoRA flags (vLLM's names): what reaches the backend's environment (and so
the Triton model's lora_modules and the EngineConfig fields), and what is refused before
anything starts, naming the flag."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvserve.backend.triton.lora_adapters import LoRAModule, LoRASettings, lora_settings_from_triton
from kvserve.frontend.cli.engine_flags import engine_env
from kvserve.frontend.cli.serve_cmd import UsageError, build_parser, plan_from_args


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def test_lora_flags_reach_the_backend(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    spec = json.dumps({"name": "b", "path": str(tmp_path / "b"), "base_model_name": "base"})
    args = parse("--enable-lora", "--lora-modules", f"a={tmp_path / 'a'}", spec, "--lora-modules",
                 f"c={tmp_path / 'a'}", "--max-loras", "4", "--max-cpu-loras", "8", "--max-lora-rank", "64",
                 "--allow-runtime-lora-updating")
    plan_from_args(args)
    env = engine_env(args)
    assert (env["KVSERVE_ENABLE_LORA"], env["KVSERVE_MAX_LORAS"], env["KVSERVE_MAX_CPU_LORAS"],
            env["KVSERVE_MAX_LORA_RANK"], env["KVSERVE_ALLOW_RUNTIME_LORA_UPDATING"]) == ("true", "4", "8", "64", "true")
    # What the Triton model reads back (config.pbtxt's parameters, the environment winning).
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = lora_settings_from_triton({"parameters": {"lora_modules": {"string_value": ""}}})
    assert settings == LoRASettings((LoRAModule("a", str(tmp_path / "a")), LoRAModule("b", str(tmp_path / "b"), "base"),
                                     LoRAModule("c", str(tmp_path / "a"))), True)


def test_a_relative_module_path_is_resolved_for_the_host(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    args = parse("--enable-lora", "--lora-modules", "r=rel")
    plan_from_args(args)
    assert json.loads(engine_env(args)["KVSERVE_LORA_MODULES"]) == [{"name": "r", "path": str(tmp_path / "rel")}]


@pytest.mark.parametrize(("argv", "named"), [
    (["--lora-modules", "a=/x"], "--lora-modules: needs --enable-lora"),
    (["--max-loras", "2"], "--max-loras: needs --enable-lora"),
    (["--allow-runtime-lora-updating"], "--allow-runtime-lora-updating: needs --enable-lora"),
    (["--enable-lora", "--lora-modules", "a=/no/such/folder"], "--lora-modules a=/no/such/folder: no such folder"),
    (["--enable-lora", "--lora-modules", "a=.", "a=."], "--lora-modules: adapter 'a' is given twice"),
    (["--enable-lora", "--served-model-name", "m", "--lora-modules", "m=."], "has the base model's served name"),
    (["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], "--max-cpu-loras (2) must be >= --max-loras (4)"),
])
def test_unworkable_lora_flags_are_refused_naming_the_flag(argv, named) -> None:
    with pytest.raises(UsageError) as err:
        plan_from_args(parse(*argv))
    assert named in str(err.value)


@pytest.mark.parametrize(("argv", "named"), [
    (["--enable-lora", "--max-loras", "0"], "--max-loras"),
    (["--enable-lora", "--max-lora-rank", "-1"], "--max-lora-rank"),
    (["--enable-lora", "--max-cpu-loras", "x"], "--max-cpu-loras"),
    (["--enable-lora", "--lora-modules", "nopath"], "--lora-modules"),
    (["--enable-lora", "--lora-modules", '{"name": "a"}'], "--lora-modules"),
    (["--enable-lora", "--lora-modules", '{"name": "a", "path": "/x", "rank": 8}'], "--lora-modules"),
    (["--enable-lora", "--lora-modules", "=/x"], "--lora-modules"),
])
def test_bad_lora_values_stop_the_parser_naming_the_flag(argv, named, capsys) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert f"argument {named}" in capsys.readouterr().err


@pytest.mark.parametrize(("values", "named"), [
    ({"lora_modules": "{"}, "lora_modules: not JSON"),
    ({"lora_modules": '{"name": "a", "path": "/x"}'}, "lora_modules: must be a JSON list"),
    ({"lora_modules": '[{"name": "a", "path": "/x"}, {"name": "a", "path": "/y"}]'}, "given twice"),
    ({"allow_runtime_lora_updating": "maybe"}, "allow_runtime_lora_updating"),
])
def test_the_triton_models_own_lora_parameters_are_checked(values, named) -> None:
    with pytest.raises(ValueError) as err:
        LoRASettings.from_values(values)
    assert named in str(err.value)
