"""The typed config: TOML and `--set` overrides are laid over the full defaults key by key."""

from __future__ import annotations

import pytest

from flows.config import ConfigError, FlywheelConfig, load_config


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


def test_unknown_keys_still_fail():
    with pytest.raises(ConfigError, match="unknown config key 'sft.max_step'"):
        load_config(overrides=["sft.max_step=3"])
