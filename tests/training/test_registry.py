"""Checkpoint registry over the lake's checkpoints table (real Parquet, real DuckDB views)."""

from __future__ import annotations

import pytest

from training.registry import (
    RegistryError,
    checkpoint_id,
    get_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    register_checkpoint,
)


def test_register_and_read_back(tmp_path):
    root = str(tmp_path / "lake")
    base = register_checkpoint(root, run_id="r1", round=0, stage="base", path="/m/base")
    sft = register_checkpoint(root, run_id="r1", round=1, stage="sft", path="/m/sft", parent_id=base.checkpoint_id,
                              snapshot_id="snap-1", metrics={"loss": 0.1, "heldout_pass": 0.93})
    grpo = register_checkpoint(root, run_id="r1", round=1, stage="grpo", path="/m/grpo", parent_id=sft.checkpoint_id,
                               snapshot_id="snap-1", metrics={"reward": 0.7})
    got = get_checkpoint(root, sft.checkpoint_id)
    assert got.parent_id == base.checkpoint_id and got.snapshot_id == "snap-1" and got.metrics["heldout_pass"] == 0.93
    assert [c.stage for c in list_checkpoints(root, "r1")] == ["base", "sft", "grpo"]
    assert latest_checkpoint(root, "r1").checkpoint_id == grpo.checkpoint_id
    assert latest_checkpoint(root, "r1", before_round=1).checkpoint_id == base.checkpoint_id
    assert latest_checkpoint(root, "other") is None


def test_reregistering_a_stage_replaces_its_row(tmp_path):
    root = str(tmp_path / "lake")
    register_checkpoint(root, run_id="r", round=1, stage="sft", path="/m/a", metrics={"try": 1})
    register_checkpoint(root, run_id="r", round=1, stage="sft", path="/m/a", metrics={"try": 2})
    cks = list_checkpoints(root, "r")
    assert len(cks) == 1 and cks[0].metrics == {"try": 2}
    assert cks[0].checkpoint_id == checkpoint_id("r", 1, "sft")


def test_unknown_checkpoint_names_the_fix(tmp_path):
    root = str(tmp_path / "lake")
    register_checkpoint(root, run_id="r", round=0, stage="base", path="/m")
    with pytest.raises(RegistryError, match="SELECT checkpoint_id"):
        get_checkpoint(root, "nope")
    with pytest.raises(ValueError, match="stage"):
        register_checkpoint(root, run_id="r", round=0, stage="dpo", path="/m")  # type: ignore[arg-type]


def test_run_id_with_a_quote_is_a_value(tmp_path):
    root = str(tmp_path / "lake")
    register_checkpoint(root, run_id="it's", round=0, stage="base", path="/m/q")
    register_checkpoint(root, run_id="it", round=0, stage="base", path="/m/p")
    assert [c.path for c in list_checkpoints(root, "it's")] == ["/m/q"]
    assert latest_checkpoint(root, "it's").run_id == "it's"
    assert list_checkpoints(root, "x' OR '1'='1") == []
