"""The typed config: TOML and `--set` overrides are laid over the full defaults key by key."""

from __future__ import annotations

import pytest

from flows.config import ConfigError, FlywheelConfig, load_config, run_config
from training.config import TINY_SFT_LEARNING_RATES


def test_one_key_of_a_section_keeps_the_sections_other_defaults(tmp_path):
    default = FlywheelConfig()
    cfg = load_config(overrides=["sft.threads=2", "teacher.seed=3"])
    assert cfg.sft.threads == 2 and cfg.sft.max_steps == default.sft.max_steps == 2000 and cfg.sft.learning_rate == 5e-3
    assert cfg.teacher.seed == 3 and cfg.teacher.noise == default.teacher.noise
    f = tmp_path / "c.toml"
    f.write_text("[grpo]\nmax_steps = 3\n[curate]\ndemo_round = 2\n")
    cfg = load_config(f)
    assert cfg.grpo.max_steps == 3 and cfg.grpo.learning_rate == default.grpo.learning_rate
    assert cfg.curate.demo_paths == default.curate.demo_paths
    assert cfg.curate.demo_round == 2 and cfg.curate.mix == default.curate.mix


def test_lists_are_replaced_whole_and_round_trip_through_toml(tmp_path):
    cfg = load_config(overrides=['flywheel.suites=[{suite="arithmetic",train_tasks=5,heldout_tasks=2}]'])
    assert len(cfg.flywheel.suites) == 1 and cfg.flywheel.suites[0].train_tasks == 5
    f = tmp_path / "saved.toml"
    f.write_text(cfg.to_toml())
    assert load_config(f) == cfg


def test_a_tiny_family_brings_its_sft_rate_unless_the_rate_is_set(tmp_path):
    """Picking tiny-gptoss (whose MoE student stalls at the default 5e-3) gives its family's SFT rate, through
    --set, a TOML file and a run's parameters; a rate set beside it wins, and the saved config reloads as it was."""
    assert TINY_SFT_LEARNING_RATES["tiny-gptoss"] != FlywheelConfig().sft.learning_rate
    cfg = load_config(overrides=['student.base="tiny-gptoss"'])
    assert cfg.sft.learning_rate == TINY_SFT_LEARNING_RATES["tiny-gptoss"]
    assert cfg.sft.max_steps == FlywheelConfig().sft.max_steps
    assert load_config(overrides=['student.base="tiny-gptoss"', "sft.learning_rate=2e-3"]).sft.learning_rate == 2e-3
    f = tmp_path / "g.toml"
    f.write_text('[student]\nbase = "tiny-gptoss"\n')
    assert load_config(f).sft.learning_rate == TINY_SFT_LEARNING_RATES["tiny-gptoss"]
    saved = tmp_path / "saved.toml"
    saved.write_text(cfg.to_toml())
    assert load_config(saved) == cfg
    assert run_config(cfg, {"student.base": "tiny"}).sft.learning_rate == TINY_SFT_LEARNING_RATES["tiny"]
    assert run_config(FlywheelConfig(), {"student.base": "tiny-gptoss"}).sft.learning_rate == cfg.sft.learning_rate
    hub = load_config(overrides=['student.base="/models/mine"'])  # not a tiny family: the default rate
    assert hub.sft.learning_rate == FlywheelConfig().sft.learning_rate


def test_unknown_keys_still_fail():
    with pytest.raises(ConfigError, match="unknown config key 'sft.max_step'"):
        load_config(overrides=["sft.max_step=3"])


def test_run_form_parameters_carry_the_config_bounds():
    """The served flows' plain run parameters take their config key's type and bounds (flows.config.form_type):
    Prefect's parameter schema (the run form, the server's schema check) holds the config's bound."""
    from prefect.utilities.callables import parameter_schema

    from flows.config import RUN_PARAMETERS, form_type
    from flows.flywheel import flywheel_flow
    from flows.generate import generate_flow

    gen = parameter_schema(generate_flow).model_dump_for_openapi()["properties"]
    for name in ("n_tasks", "samples"):
        bounded = [k for k in gen[name]["anyOf"] if k.get("type") == "integer"]
        assert bounded == [{"type": "integer", "exclusiveMinimum": 0}], name
    assert [k.get("enum") for k in gen["backend"]["anyOf"] if "enum" in k] == [["auto", "docker", "local"]]
    fw = parameter_schema(flywheel_flow).model_dump_for_openapi()["properties"]
    assert {"type": "integer", "minimum": 1} in fw["rounds"]["anyOf"]
    assert str(form_type(RUN_PARAMETERS["generate"]["n_tasks"])) == str(form_type("generate.n_tasks"))
    assert form_type("generate.suite") is str  # no bound: the plain type


def test_a_bad_run_parameter_is_refused_before_the_run_starts():
    """n_tasks=-3 fails the deployment's run-form schema (what the server checks with enforce_parameter_schema,
    before it creates the run) and the flow's own parameter validation (before its body runs)."""
    from prefect.exceptions import ParameterTypeError
    from prefect.utilities.schema_tools import ValidationError, validate

    from flows.config import ServeConfig
    from flows.generate import generate_flow
    from flows.serve import build_deployments

    cfg = FlywheelConfig()
    (dep,) = build_deployments(cfg, ServeConfig(flows=["generate"]))
    assert dep.enforce_parameter_schema
    schema = dep._parameter_openapi_schema.model_dump_for_openapi()
    assert schema["properties"]["n_tasks"]["exclusiveMinimum"] == 0
    validate({"n_tasks": 3}, schema, raise_on_error=True, ignore_required=True)
    with pytest.raises(ValidationError, match="n_tasks"):
        validate({"n_tasks": -3}, schema, raise_on_error=True, ignore_required=True)
    with pytest.raises(ParameterTypeError, match="n_tasks"):
        generate_flow.validate_parameters({"cfg": cfg, "n_tasks": -3})
    assert generate_flow.validate_parameters({"cfg": cfg, "n_tasks": 3})["n_tasks"] == 3
