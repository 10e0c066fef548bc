"""The run report's plots: the mismatch panel readable at a glance (each figure on its own axis); GRPO's gradient
health per step from the rows the grpo stage writes."""

from __future__ import annotations

from datetime import UTC, datetime

from flows.train import grpo_step_rows
from warehouse.lake import write_rows
from warehouse.report import _plot_panel, build_report, gradient_health, sft_data


def _m(round: int, metric: str, value: float) -> dict:
    return {"run_id": "run1", "round": round, "stage": "mismatch", "subject": "mismatch", "split": "train",
            "suite": "all", "metric": metric, "value": value, "created_at": datetime.now(UTC)}


# round 1 matched (fp32 both sides), round 2 drifted: figures six orders of magnitude apart
PANEL = {1: {"mean_abs_diff": 1.2e-7, "max_abs_diff": 9.5e-7, "token_mult_prob_error": 1.0000002, "iw_max": 1.000001,
             "clip_fraction": 0.0, "pearson": 0.99},
         2: {"mean_abs_diff": 3.1e-7, "max_abs_diff": 2.0e-6, "token_mult_prob_error": 1.25, "iw_max": 3.2,
             "clip_fraction": 0.04, "pearson": 0.71}}
LIMITS = {"mm_max:token_mult_prob_error": 1.1, "mm_max:mean_abs_diff": 0.1, "mm_max:clip_fraction": 0.0}


def _rows() -> list[dict]:
    return ([_m(rd, f"mm:{k}", v) for rd, figs in PANEL.items() for k, v in figs.items()]
            + [_m(rd, k, v) for rd in PANEL for k, v in LIMITS.items()])


def test_mismatch_panel_puts_each_figure_on_its_own_axis(tmp_path):
    limits = _plot_panel(_rows(), tmp_path / "panel.png")
    assert (tmp_path / "panel.png").stat().st_size > 0
    assert list(limits) == ["mean_abs_diff", "max_abs_diff", "token_mult_prob_error", "iw_max", "clip_fraction",
                            "pearson"]
    for name, (lo, hi) in limits.items():
        vals = [PANEL[rd][name] for rd in PANEL]
        assert lo <= min(vals) and max(vals) <= hi
        # the data fills its axis: not flattened by a figure or a limit of another scale
        assert max(vals) - min(vals) >= 0.2 * (hi - lo), (name, lo, hi)
    assert limits["mean_abs_diff"][1] < 1e-5  # its limit 0.1 is named, not drawn
    lo, hi = limits["token_mult_prob_error"]
    assert lo <= 1.1 <= hi  # its limit lies among the data: drawn


def test_report_draws_the_panel_from_the_rounds_table(tmp_path):
    root = str(tmp_path / "lake")
    write_rows(root, "rounds", _rows())
    report = build_report(root, "run1")
    assert any(p.endswith("mismatch_panel.png") for p in report.plots)
    assert "mm_max:token_mult_prob_error" in report.markdown  # the limits that applied, in the metrics table
    empty = str(tmp_path / "other")
    write_rows(empty, "rounds", [dict(_m(1, "yield", 1.0), stage="teacher", subject="teacher")])
    assert not any(p.endswith("mismatch_panel.png") for p in build_report(empty, "run1").plots)


def test_gradient_health_per_step_lands_in_the_rounds_table_and_the_report(tmp_path):
    steps = [{"step": 1, "grad_norm": 2.5, "clip_fraction": 0.0, "importance_weight_max": 1.0, "reward": 0.2},
             {"step": 2, "grad_norm": 40.0, "clip_fraction": 0.1, "importance_weight_max": 3.0, "reward": 0.3}]
    exploded = [*steps, {"step": 3, "grad_norm": float("inf"), "reward": 0.3}]
    rows = (grpo_step_rows("run1", 1, steps, stop_grad_norm=1000.0, stopped=None)
            + grpo_step_rows("run1", 2, exploded, stop_grad_norm=1000.0, stopped="step 3: grad norm inf > ..."))
    names = {(r["round"], r["metric"]) for r in rows}
    assert {(1, "grad_norm:1"), (1, "grad_norm:2"), (1, "clip_fraction:2"), (1, "grpo_stop_grad_norm")} <= names
    assert (2, "grpo_stopped_at") in names and (1, "grpo_stopped_at") not in names
    assert (2, "grad_norm:3") not in names  # not finite: the stop row says where, no inf in the table
    assert all(r["subject"] == "step" for r in rows if ":" in r["metric"])
    root = str(tmp_path / "lake")
    write_rows(root, "rounds", rows)
    report = build_report(root, "run1")
    assert any(p.endswith("gradient_health.png") for p in report.plots)
    table = {r["round"]: r for r in gradient_health([dict(r) for r in rows])}
    assert table[1]["grad_norm_max"] == 40.0 and table[1]["stopped_at_step"] == ""
    assert table[2]["stopped_at_step"] == 3 and table[2]["importance_weight_max"] == 3.0
    assert "GRPO gradient health" in report.markdown and "grad_norm:1" not in report.markdown  # table, not rows


def test_a_matched_panel_writes_values_near_1_as_1_plus_their_deviation(tmp_path):
    """fp32 both sides: token_mult_prob_error and iw_max sit 1e-9 above 1, pearson 1e-12 below; their ticks and
    labels say so (1+7.2e-09), where 3 significant digits (or matplotlib's offset, "1e-9+1") hid it."""
    from warehouse.report import _panel_label

    assert _panel_label("token_mult_prob_error", [1.0000000072, 1.0000000012])(1.0000000072) == "1+7.2e-09"
    assert _panel_label("pearson", [0.9999999999943])(0.9999999999943) == "1-5.7e-12"
    assert _panel_label("token_mult_prob_error", [1.0000002, 1.25])(1.25) == "1.25"  # a real gap: plain
    assert _panel_label("mean_abs_diff", [7.2e-9])(7.2e-9) == "7.2e-09"
    matched = [_m(rd, f"mm:{k}", v) for rd, k, v in ((1, "token_mult_prob_error", 1.0000000072),
                                                       (2, "token_mult_prob_error", 1.0000000012))]
    limits = _plot_panel(matched, tmp_path / "panel.png")
    lo, hi = limits["token_mult_prob_error"]
    assert lo <= 1.0000000012 and 1.0000000072 <= hi


def test_sft_data_per_suite_is_a_table_of_the_report_not_rows_of_all_metrics(tmp_path):
    from flows.stages import metric

    counts = {"bfcl-multi-turn": {"examples": 2, "truncated": 1, "dropped_truncated": 1, "tokens": 3000,
                                  "assistant_turns": 14, "trained_turns": 12},
              "harbor": {"examples": 4, "tokens": 480, "assistant_turns": 8, "trained_turns": 8}}
    rows = [metric("run1", 1, "sft", "data", "train", suite, f"sft_{k}", v)
            for suite, c in counts.items() for k, v in c.items()]
    root = str(tmp_path / "lake")
    write_rows(root, "rounds", rows)
    report = build_report(root, "run1")
    table = {r["suite"]: r for r in sft_data([dict(r, round=1) for r in rows])}
    assert table["bfcl-multi-turn"] == {"round": 1, "suite": "bfcl-multi-turn", "examples": 2, "truncated": 1,
                                        "dropped_truncated": 1, "dropped_malformed": 0, "assistant_turns": 14,
                                        "trained_turns": 12, "tokens_per_example": 1500.0}
    assert table["harbor"]["tokens_per_example"] == 120.0
    assert "SFT data per suite" in report.markdown and "sft_trained_turns" not in report.markdown
