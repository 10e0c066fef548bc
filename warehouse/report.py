"""The report of a flywheel run: PNG plots, markdown and HTML, built from the rounds table of the lake.

Plots: held-out pass@1 per round for the base, each student and the teacher (one panel per suite); teacher yield;
hack rate by reason code; the snapshot mix by source; wall time per stage; the promotion against the incumbent per
round (incumbent, SFT, GRPO and the student that went on, greedy and sampled); in runs with GRPO, SFT vs GRPO per round
(greedy and sampled held-out pass@1, the SFT-only control) and GRPO's reward and hack rate per step (from its own
episodes, stage grpo). Tables: held-out pass rate, the SFT-only control and GRPO's steps (runs with GRPO), the
shape of the episodes per round, stage, source and suite (turns, user turns, tool calls per turn, tokens, the turn
where the ones that did not pass ended), SFT's data per suite (kept, cut, dropped, assistant turns trained), the
verifier health of the run's tasks per suite (from `flywheel tasks audit`'s verifier_health rows, when there are
any), the task factory's funnel and cost per writer (every task_synthesis row of the lake, when there are any: the
factory is not tied to a run) and the tasks the run's synthesize stage grew from its student's failures (per round
and frontier cell), all round metrics. Written to ROOT/runs/RUN_ID/report/ (local roots; a remote root gets its report in a
local folder named in the result). Reads only; trains nothing.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.query import query


@dataclass
class Report:
    folder: str
    markdown: str
    markdown_path: str
    html_path: str
    plots: list[str]


def _rounds(root: str, run_id: str) -> list[dict[str, Any]]:
    return query(root, """
        SELECT round::INTEGER AS round, stage, subject, split, suite, metric, arg_max(value, created_at) AS value
        FROM rounds WHERE run_id = ?
        GROUP BY ALL ORDER BY round, stage, subject, suite, metric""", [run_id]).to_pylist()


def heldout_table(root: str, run_id: str) -> list[dict[str, Any]]:
    """Held-out pass@1 (and pass@k where measured) per round, subject and suite: the table people look at first."""
    rows = _rounds(root, run_id)
    out: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r["split"] != "heldout" or not r["metric"].startswith(("pass@", "sampled_pass@")):
            continue
        key = (r["round"], r["subject"], r["suite"])
        out.setdefault(key, {"round": r["round"], "subject": r["subject"], "suite": r["suite"]})[r["metric"]] = \
            round(r["value"], 4)
    return [out[k] for k in sorted(out)]


def control_table(root: str, run_id: str) -> list[dict[str, Any]]:
    """Per round with GRPO, the SFT-only control: SFT's and GRPO's held-out greedy and sampled pass@1 (over all
    suites), GRPO's sampled gain with its standard error, and which checkpoint went on, with the rule's reason code
    (flows.evaluate.stage_control writes these rows)."""
    rows = [r for r in _rounds(root, run_id) if r["suite"] == "all"]
    out: dict[int, dict[str, Any]] = {}
    for r in rows:
        rd = r["round"]
        if r["subject"] in ("sft", "grpo") and r["split"] == "heldout" and r["metric"] in ("pass@1", "sampled_pass@1"):
            name = ("greedy" if r["metric"] == "pass@1" else "sampled") + f"_{r['subject']}"
            out.setdefault(rd, {"round": rd})[name] = round(r["value"], 4)
        elif r["subject"] == "promotion":
            row = out.setdefault(rd, {"round": rd})
            if r["metric"] == "grpo_gain_sampled_pass@1":
                row["gain_sampled"] = round(r["value"], 4)
            elif r["metric"] == "grpo_gain_sampled_se":
                row["gain_se"] = round(r["value"], 4)
            elif r["metric"] == "promoted_grpo":
                row["promoted"] = "grpo" if r["value"] else "sft"
            elif r["metric"].startswith("reason:"):
                row["reason"] = r["metric"][len("reason:"):]
    return [out[k] for k in sorted(out) if "promoted" in out[k]]


def promotion_table(root: str, run_id: str) -> list[dict[str, Any]]:
    """Per round, the promotion against the incumbent: the held-out greedy and sampled pass@1 (all suites) of the
    incumbent (the student the round started from: round 0's base, or the previous round's student), of the round's
    SFT and GRPO checkpoints, and of the student that went on; whether the candidate replaced the incumbent and the
    reason code (flows.evaluate.stage_control writes these rows)."""
    rows = _rounds(root, run_id)
    score: dict[tuple[int, str, str], float] = {}
    decided: dict[int, dict[str, Any]] = {}
    for r in rows:
        if r["split"] == "heldout" and r["suite"] == "all" and r["metric"] in ("pass@1", "sampled_pass@1"):
            score[(r["round"], r["subject"], r["metric"])] = r["value"]
        elif r["subject"] == "promotion" and r["suite"] == "all":
            d = decided.setdefault(r["round"], {})
            if r["metric"] == "incumbent_promoted":
                d["promoted"] = "candidate" if r["value"] else "incumbent"
            elif r["metric"].startswith("incumbent_reason:"):
                d["reason"] = r["metric"][len("incumbent_reason:"):]
    out = []
    for rd in sorted(decided):
        row: dict[str, Any] = {"round": rd}
        before = (rd - 1, "base" if rd == 1 else "student")
        for kind, m in (("greedy", "pass@1"), ("sampled", "sampled_pass@1")):
            for label, key in (("incumbent", before), ("sft", (rd, "sft")), ("grpo", (rd, "grpo")),
                               ("promoted", (rd, "student"))):
                v = score.get((key[0], key[1], m))
                if v is not None:
                    row[f"{kind}_{label}"] = round(v, 4)
        out.append({**row, **decided[rd]})
    return out


def _plot_promotion(table: list[dict[str, Any]], path: Path) -> None:
    """Grouped bars per round: the incumbent, SFT's and GRPO's checkpoints and the student that went on; a round
    whose candidate was refused says so under its bars."""
    import matplotlib.pyplot as plt

    labels = (("incumbent", "0.55"), ("sft", "tab:blue"), ("grpo", "tab:orange"), ("promoted", "tab:green"))
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.6), squeeze=False)
    width = 0.2
    for ax, kind in zip(axes[0], ("greedy", "sampled")):
        for k, (label, color) in enumerate(labels):
            xs = [r["round"] + (k - 1.5) * width for r in table]
            ys = [r.get(f"{kind}_{label}", math.nan) for r in table]
            bars = ax.bar(xs, [0.0 if math.isnan(y) else y for y in ys], width, color=color, label=label)
            for b, y in zip(bars, ys):
                if not math.isnan(y):
                    ax.annotate(f"{y:.2f}", (b.get_x() + width / 2, y), ha="center", va="bottom", fontsize=7,
                                xytext=(0, 1), textcoords="offset points")
        ax.set_xticks([r["round"] for r in table],
                      [f"round {r['round']}" + ("\nincumbent kept" if r.get("promoted") == "incumbent" else "")
                       for r in table])
        ax.set_title(f"held-out {kind} pass@1", fontsize=10)
        ax.set_ylim(0, 1.12)
        ax.grid(alpha=0.3, axis="y")
    handles, names = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, names, fontsize=8, ncol=4, loc="lower center")
    fig.suptitle("promotion against the incumbent", fontsize=11)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def grpo_steps(root: str, run_id: str) -> list[dict[str, Any]]:
    """Per round and GRPO step, from GRPO's own episodes (stage grpo): episodes, mean reward, hack rate, the share
    of zero-advantage episodes; scored verdicts only."""
    from warehouse.record import SCORED_VERDICTS

    return query(root, """
        SELECT round::INTEGER AS round, grpo_step, count(*) AS episodes, round(avg(reward), 4) AS reward,
               round(avg((verdict = 'hack')::INTEGER), 4) AS hack_rate,
               round(avg((advantage = 0)::INTEGER), 4) AS zero_advantage
        FROM trajectories WHERE run_id = ? AND stage = 'grpo' AND list_contains(?::VARCHAR[], verdict)
        GROUP BY ALL ORDER BY ALL""", [run_id, list(SCORED_VERDICTS)]).to_pylist()


def _plot_control(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4), squeeze=False)
    rounds = [r["round"] for r in table]
    for ax, kind in zip(axes[0], ("greedy", "sampled")):
        for subject, style in (("sft", "s--"), ("grpo", "o-")):
            ys = [r.get(f"{kind}_{subject}", float("nan")) for r in table]
            ax.plot(rounds, ys, style, label=subject)
        if kind == "sampled":  # the gain's standard error around GRPO's point
            ax.errorbar(rounds, [r.get("sampled_grpo", float("nan")) for r in table],
                        yerr=[r.get("gain_se", 0.0) for r in table], fmt="none", ecolor="gray", capsize=3)
        ax.set_title(f"held-out {kind} pass@1: SFT vs GRPO")
        ax.set_xticks(rounds)
        ax.set_xlabel("round")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_grpo_steps(steps: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8.4, 3.4), squeeze=False)
    for rd in sorted({s["round"] for s in steps}):
        pts = [s for s in steps if s["round"] == rd]
        xs = [s["grpo_step"] for s in pts]
        axes[0][0].plot(xs, [s["reward"] for s in pts], "o-", label=f"round {rd}")
        axes[0][1].plot(xs, [s["hack_rate"] for s in pts], "o-", label=f"round {rd}")
    for ax, title in zip(axes[0], ("GRPO mean reward per step", "GRPO hack rate per step")):
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def episode_turns(root: str, run_id: str) -> list[dict[str, Any]]:
    """Per round, stage, source and suite, the shape of the run's episodes (infra errors left out): episodes, mean
    assistant turns, user turns (above 1 on multi-turn tasks), tool calls per assistant turn, tokens per episode
    (where the policy reported them), and where the episodes that did not pass ended: how many, and how many at
    each assistant turn (`fail_at_turn`, e.g. `1:3 2:1`) and user turn (`fail_at_user_turn`)."""
    def at(x: str) -> str:  # a histogram of the episodes that did not pass, as `1:3 2:1`
        return (f"array_to_string(list_transform(map_entries(histogram({x}) FILTER (WHERE verdict <> 'pass')), "
                "lambda e: e.key || ':' || e.value), ' ')")

    rows = query(root, f"""
        SELECT round::INTEGER AS round, stage, source, suite, count(*) AS episodes, round(avg(turns), 2) AS turns,
               round(avg(user_turns), 2) AS user_turns,
               round(sum(n_tool_calls) / greatest(sum(turns), 1), 2) AS calls_per_turn,
               round(avg(tokens) FILTER (WHERE tokens > 0), 1) AS tokens,
               count(*) FILTER (WHERE verdict <> 'pass') AS not_passed,
               {at("turns")} AS fail_at_turn, {at("user_turns")} AS fail_at_user_turn
        FROM (SELECT *, prompt_tokens + completion_tokens AS tokens,
                     len(list_filter(messages, lambda m: m.role = 'user')) AS user_turns
              FROM trajectories WHERE run_id = ? AND verdict <> 'infra_error')
        GROUP BY ALL ORDER BY ALL""", [run_id]).to_pylist()
    return [{k: "" if v is None else v for k, v in r.items()} for r in rows]  # no tokens reported: blank


SFT_DATA = ("examples", "truncated", "dropped_truncated", "dropped_malformed", "assistant_turns", "trained_turns")


def sft_data(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round and suite, what SFT kept, cut and dropped, the episodes' assistant turns and those trained, and its
    tokens per example (the rounds table's `sft_*` rows, subject 'data', that flows.train.stage_sft writes)."""
    per: dict[tuple[int, str], dict[str, float]] = {}
    for r in rows:
        if r["stage"] == "sft" and r["subject"] == "data" and r["metric"].startswith("sft_"):
            per.setdefault((r["round"], r["suite"]), {})[r["metric"].removeprefix("sft_")] = r["value"]
    out = []
    for (rd, suite), m in sorted(per.items()):
        row: dict[str, Any] = {"round": rd, "suite": suite, **{k: int(m.get(k, 0)) for k in SFT_DATA}}
        row["tokens_per_example"] = round(m.get("tokens", 0) / m["examples"], 1) if m.get("examples") else ""
        out.append(row)
    return out


def health_table(root: str, run_id: str) -> list[dict[str, Any]]:
    """Per suite, the latest verifier_health figures of the tasks this run has rows of."""
    return query(root, """
        SELECT suite, COUNT(*) AS tasks, SUM(oracle_pass::INTEGER) AS oracle_passes,
               SUM(null_pass::INTEGER) AS null_passes, SUM(n_mutants) AS mutants, SUM(mutants_killed) AS killed,
               round(SUM(mutants_killed) / NULLIF(SUM(n_mutants), 0), 4) AS kill_rate,
               SUM((flake_rate > 0)::INTEGER) AS flaky, SUM((error IS NOT NULL)::INTEGER) AS errors
        FROM (SELECT * FROM verifier_health
              WHERE task_id IN (SELECT DISTINCT task_id FROM trajectories WHERE run_id = ?)
              QUALIFY row_number() OVER (PARTITION BY task_id ORDER BY created_at DESC) = 1)
        GROUP BY suite ORDER BY suite""", [run_id]).to_pylist()


def synthesis_funnel(root: str) -> list[dict[str, Any]]:
    """Per writer and family, candidates admitted and refused by each reason code (a candidate refused for several
    reasons counts under each), from every task_synthesis row of the lake."""
    return query(root, """
        SELECT writer, family, outcome, COUNT(*) AS candidates FROM (
            SELECT writer, family, 'admitted' AS outcome FROM task_synthesis WHERE decision = 'admitted'
            UNION ALL
            SELECT writer, family, unnest(reason_codes) AS outcome FROM task_synthesis WHERE decision = 'refused')
        GROUP BY writer, family, outcome
        ORDER BY writer, family, outcome = 'admitted' DESC, candidates DESC, outcome""").to_pylist()


def synthesis_cost(root: str) -> list[dict[str, Any]]:
    """Per writer: candidates, admitted, yield, writer tokens and USD, USD and audit seconds per admitted task."""
    return query(root, """
        SELECT writer, COUNT(*) AS candidates, SUM((decision = 'admitted')::INTEGER) AS admitted,
               round(AVG((decision = 'admitted')::INTEGER), 4) AS yield,
               SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)) AS writer_tokens,
               round(SUM(COALESCE(writer_usd, 0)), 4) AS writer_usd,
               round(SUM(COALESCE(writer_usd, 0)) / NULLIF(SUM((decision = 'admitted')::INTEGER), 0), 4)
                   AS usd_per_admitted,
               round(SUM(COALESCE(build_s, 0) + COALESCE(audit_s, 0)) / NULLIF(SUM((decision = 'admitted')::INTEGER), 0), 2)
                   AS build_audit_s_per_admitted
        FROM task_synthesis GROUP BY writer ORDER BY writer""").to_pylist()


def synthesis_lineage(root: str, run_id: str) -> list[dict[str, Any]]:
    """The run's synthesize stage (flywheel.synthesize) per round and failure-frontier cell: the student's failed
    episodes that asked, the candidates written near them, how many were admitted (no rows for a run without it)."""
    return query(root, """
        SELECT round, frontier, max(len(asked_by)) AS failures, COUNT(*) AS candidates,
               SUM((decision = 'admitted')::INTEGER) AS admitted
        FROM task_synthesis WHERE run_id = ? GROUP BY round, frontier ORDER BY round, frontier""", [run_id]).to_pylist()


def _folder(root: str, run_id: str) -> Path:
    if "://" in root and not root.startswith("file://"):
        return Path("runs") / "reports" / run_id
    base = root[len("file://"):] if root.startswith("file://") else root
    return Path(base) / "runs" / run_id / "report"


def _plot_heldout(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib.pyplot as plt

    suites = sorted({r["suite"] for r in rows if r["split"] == "heldout" and r["metric"] == "pass@1"})
    fig, axes = plt.subplots(1, max(1, len(suites)), figsize=(4.2 * max(1, len(suites)), 3.4), squeeze=False)
    for ax, suite in zip(axes[0], suites):
        pts = [r for r in rows if r["split"] == "heldout" and r["metric"] == "pass@1" and r["suite"] == suite]
        student = sorted((r["round"], r["value"]) for r in pts if r["subject"] in ("base", "student"))
        if student:
            ax.plot([x for x, _ in student], [y for _, y in student], "o-", label="student (round 0 = base)")
        teacher = [r["value"] for r in pts if r["subject"] == "teacher"]
        if teacher:
            ax.axhline(teacher[-1], ls="--", color="gray", label="teacher")
        ax.set_title(suite)
        ax.set_xticks(sorted({r["round"] for r in rows}))
        ax.set_xlabel("round")
        ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel("held-out pass@1")
        ax.grid(alpha=0.3)
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_bars(rows: list[dict[str, Any]], prefix: str, subject: str, title: str, ylabel: str, path: Path,
               stacked: bool = True) -> bool:
    import matplotlib.pyplot as plt

    pts = [r for r in rows if r["subject"] == subject and r["metric"].startswith(prefix)]
    if not pts:
        return False
    rounds = sorted({r["round"] for r in pts})
    series = sorted({r["metric"][len(prefix):] or r["metric"] for r in pts})
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    bottom = [0.0] * len(rounds)
    width = 0.6 if stacked else 0.8 / max(1, len(series))
    for i, s in enumerate(series):
        vals = [sum(r["value"] for r in pts if r["round"] == rd and (r["metric"][len(prefix):] or r["metric"]) == s)
                for rd in rounds]
        xs = list(range(len(rounds))) if stacked else [x + i * width for x in range(len(rounds))]
        ax.bar(xs, vals, width, bottom=bottom if stacked else None, label=s)
        if stacked:
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(rounds)), [str(r) for r in rounds])
    ax.set_xlabel("round")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# the panel's figures in reading order, each with the value a matched trainer and rollout give
PANEL_IDEAL = {"mean_abs_diff": 0.0, "max_abs_diff": 0.0, "token_mult_prob_error": 1.0, "iw_max": 1.0,
               "clip_fraction": 0.0, "pearson": 1.0}


def _plain(v: float) -> str:
    return f"{v:.3g}"


def _panel_label(name: str, ys: list[float]) -> Any:
    """How a figure's values are written: 3 significant digits, or, where they all sit within 1e-3 of a matched
    value that is not 0 (token_mult_prob_error, iw_max, pearson near 1), that value and the deviation (1+7.2e-09),
    which 3 digits would write as 1 for every round."""
    ideal = PANEL_IDEAL.get(name)
    if not ideal or not ys or max(abs(y - ideal) for y in ys) >= 1e-3 * abs(ideal):
        return _plain
    return lambda v, i=ideal: f"{i:g}{v - i:+.2g}" if abs(v - i) > 1e-15 * abs(i) else f"{i:g}"


def _plot_panel(rows: list[dict[str, Any]], path: Path) -> dict[str, tuple[float, float]]:
    """The mismatch panel per round: one small plot per figure on its own y axis (they differ by orders of
    magnitude: |Δlogp| near 1e-7 when matched, token_mult_prob_error near 1), the matched value dotted and the
    promotion limit that applied (rounds metrics mm_max:/mm_min:) dashed red. Returns each figure's y limits
    (empty, and no file, for a run without a panel)."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    pts = [r for r in rows if r["subject"] == "mismatch"]
    figs = [m for m in PANEL_IDEAL if any(r["metric"] == f"mm:{m}" for r in pts)]
    figs += sorted({r["metric"][3:] for r in pts if r["metric"].startswith("mm:")} - set(figs))
    if not figs:
        return {}
    cols = min(3, len(figs))
    nrows = -(-len(figs) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.7 * nrows), squeeze=False)
    limits: dict[str, tuple[float, float]] = {}
    for ax, name in zip([a for row in axes for a in row], figs):
        series = sorted((r["round"], r["value"]) for r in pts if r["metric"] == f"mm:{name}")
        xs, ys = [x for x, _ in series], [y for _, y in series]
        ax.plot(xs, ys, "o-", color="tab:blue")
        label = _panel_label(name, ys)
        for x, y in series:
            ax.annotate(label(y), (x, y), textcoords="offset points", xytext=(0, 5), ha="center", fontsize=7)
        if label is not _plain:  # ticks as the matched value and a deviation, not matplotlib's "1e-9+1" offset
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos, f=label: f(v)))
        if name in PANEL_IDEAL:
            ax.axhline(PANEL_IDEAL[name], ls=":", color="gray", label=f"matched ({PANEL_IDEAL[name]:g})")
        ax.margins(y=0.18)  # room for the value labels
        if name in PANEL_IDEAL and max(abs(y - PANEL_IDEAL[name]) for y in ys) < 1e-12:  # float noise: matched
            ax.set_ylim(PANEL_IDEAL[name] - 0.01, PANEL_IDEAL[name] + 0.01)
        lo, hi = ax.get_ylim()
        for side in ("max", "min"):
            lim = [r["value"] for r in pts if r["metric"] == f"mm_{side}:{name}"]
            if not lim:
                continue
            words = f"refused {'above' if side == 'max' else 'below'} {lim[-1]:g}"
            if lo - (hi - lo) <= lim[-1] <= hi + (hi - lo):  # near the data: drawn
                ax.axhline(lim[-1], ls="--", color="tab:red", label=words)
            else:  # far off: named, not drawn (a line there would squash the figure flat)
                ax.plot([], [], ls="--", color="tab:red", label=f"{words} (off the axis)")
        ax.set_title(name, fontsize=9)
        ax.set_xticks(xs)
        ax.set_xlabel("round", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
        limits[name] = ax.get_ylim()
    for ax in [a for row in axes for a in row][len(figs):]:
        ax.set_visible(False)
    fig.suptitle("trainer vs rollout log-probabilities (mismatch panel), each figure on its own axis", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return limits


def _step_series(rows: list[dict[str, Any]], name: str) -> dict[int, list[tuple[int, float]]]:
    """Per round, GRPO's per-step figure `name` (rounds rows subject 'step', metric NAME:STEP) in step order."""
    out: dict[int, list[tuple[int, float]]] = {}
    for r in rows:
        if r["subject"] == "step" and r["metric"].rpartition(":")[0] == name:
            out.setdefault(r["round"], []).append((int(r["metric"].rpartition(":")[2]), r["value"]))
    return {rd: sorted(v) for rd, v in sorted(out.items())}


def gradient_health(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round with GRPO steps: steps logged, the largest and last gradient norm, the largest clip fraction and
    importance weight, the stop threshold and the step GRPO stopped at (when its norms exploded)."""
    out = []
    for rd, norms in _step_series(rows, "grad_norm").items():
        def stage(m: str, rd: int = rd) -> float | None:
            vs = [r["value"] for r in rows if r["round"] == rd and r["stage"] == "grpo" and r["metric"] == m]
            return vs[-1] if vs else None
        clip = [v for _, v in _step_series(rows, "clip_fraction").get(rd, [])]
        iw = [v for _, v in _step_series(rows, "importance_weight_max").get(rd, [])]
        stopped = stage("grpo_stopped_at")
        out.append({"round": rd, "steps": len(norms), "grad_norm_max": round(max(v for _, v in norms), 4),
                    "grad_norm_last": round(norms[-1][1], 4),
                    "clip_fraction_max": round(max(clip), 4) if clip else "",
                    "importance_weight_max": round(max(iw), 4) if iw else "",
                    "stop_grad_norm": stage("grpo_stop_grad_norm") or "",
                    "stopped_at_step": int(stopped) if stopped is not None else ""})
    return out


def _plot_gradient_health(rows: list[dict[str, Any]], path: Path) -> bool:
    """GRPO's gradient norm per step (log scale, each round a line, the stop threshold dashed red), and its clip
    fraction and largest importance weight per step when TRL logged them. False (no file) without steps."""
    import matplotlib.pyplot as plt

    names = [n for n in ("grad_norm", "clip_fraction", "importance_weight_max") if _step_series(rows, n)]
    if "grad_norm" not in names:
        return False
    fig, axes = plt.subplots(1, len(names), figsize=(3.8 * len(names), 3.0), squeeze=False)
    for ax, name in zip(axes[0], names):
        for rd, pts in _step_series(rows, name).items():
            ax.plot([s for s, _ in pts], [v for _, v in pts], "o-", ms=3, label=f"round {rd}")
        if name == "grad_norm":
            ax.set_yscale("log")
            stop = [r["value"] for r in rows if r["metric"] == "grpo_stop_grad_norm"]
            if stop:
                ax.axhline(stop[-1], ls="--", color="tab:red", label=f"stops above {stop[-1]:g}")
        ax.set_title(f"GRPO {name} per step", fontsize=9)
        ax.set_xlabel("GRPO step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _md_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "_none yet_\n"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            cells.append(f"{v:.1%}" if isinstance(v, float) and c.startswith("pass@") else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def build_report(root: str, run_id: str) -> Report:
    """Write plots, report.md and report.html for the run; return where they are and the markdown."""
    import matplotlib

    matplotlib.use("Agg")
    folder = _folder(str(root), run_id)
    folder.mkdir(parents=True, exist_ok=True)
    rows = _rounds(str(root), run_id)
    plots: list[str] = []
    p = folder / "heldout_pass_rate.png"
    _plot_heldout(rows, p)
    plots.append(p.name)
    for name, prefix, subject, title, ylabel, stacked in (
            ("teacher_yield.png", "yield", "teacher", "teacher yield (passing share of episodes)", "yield", False),
            ("hack_rate.png", "hack:", "teacher", "teacher hack rate by reason code", "share of episodes", True),
            ("snapshot_mix.png", "mix:", "snapshot", "training snapshot mix by source", "examples", True),
            ("stage_wall_time.png", "wall_s", "stage", "wall time per round", "seconds", True)):
        if name == "stage_wall_time.png":
            pts = [dict(r, metric=f"wall_s{r['stage']}") for r in rows if r["subject"] == "stage"
                   and r["metric"] == "wall_s"]
            ok = _plot_bars(pts, "wall_s", "stage", title, ylabel, folder / name, stacked)
        else:
            ok = _plot_bars(rows, prefix, subject, title, ylabel, folder / name, stacked)
        if ok:
            plots.append(name)
    if _plot_panel(rows, folder / "mismatch_panel.png"):
        plots.append("mismatch_panel.png")
    promotion = promotion_table(str(root), run_id)
    if promotion:
        _plot_promotion(promotion, folder / "promotion.png")
        plots.append("promotion.png")
    control = control_table(str(root), run_id)
    if control:
        _plot_control(control, folder / "sft_vs_grpo.png")
        plots.append("sft_vs_grpo.png")
    grad = gradient_health(rows)
    if _plot_gradient_health(rows, folder / "gradient_health.png"):
        plots.append("gradient_health.png")
    steps = grpo_steps(str(root), run_id)
    if steps:
        _plot_grpo_steps(steps, folder / "grpo_steps.png")
        plots.append("grpo_steps.png")
    heldout = heldout_table(str(root), run_id)
    turns = episode_turns(str(root), run_id)
    data = sft_data(rows)
    other = [r for r in rows if not (r["split"] == "heldout" and r["metric"].startswith(("pass@", "sampled_pass@")))
             and r["metric"] not in ("episodes", "sampled_episodes") and r["subject"] not in ("step", "data")]
    for r in other:
        r["value"] = round(r["value"], 4)
    md = [f"# flywheel run `{run_id}`\n", "## Held-out pass rate\n", _md_table(heldout)]
    if promotion:
        md += ["## Promotion against the incumbent\n", _md_table(promotion)]
    if control:
        md += ["## SFT-only control (rounds with GRPO)\n", _md_table(control)]
    if steps:
        md += ["## GRPO steps (its own episodes)\n", _md_table(steps)]
    if grad:
        md += ["## GRPO gradient health (per step in the rounds table, subject 'step')\n", _md_table(grad)]
    if turns:
        md += ["## Episodes: turns, tool calls, tokens, where they fail\n", _md_table(turns)]
    if data:
        md += ["## SFT data per suite (kept, cut, dropped; assistant turns trained)\n", _md_table(data)]
    md += [f"![{n}]({n})\n" for n in plots]
    health = health_table(str(root), run_id)
    if health:
        md += ["## Verifier health (flywheel tasks audit)\n", _md_table(health)]
    funnel, cost = synthesis_funnel(str(root)), synthesis_cost(str(root))
    lineage = synthesis_lineage(str(root), run_id) if funnel else []
    if funnel:
        md += ["## Task factory (flywheel tasks synthesize)\n", _md_table(cost), _md_table(funnel)]
    if lineage:
        md += ["## Tasks grown from the student's failures (flywheel.synthesize)\n", _md_table(lineage)]
    md += ["## All round metrics\n", _md_table([{k: r[k] for k in ("round", "stage", "subject", "split", "suite",
                                                                    "metric", "value")} for r in other])]
    markdown = "\n".join(md)
    (folder / "report.md").write_text(markdown)
    body = "".join(
        f"<h2>{html.escape(t)}</h2>{_html_table(rs)}" for t, rs in (
            ("Held-out pass rate", heldout), ("Promotion against the incumbent", promotion),
            ("SFT-only control (rounds with GRPO)", control),
            ("GRPO steps (its own episodes)", steps), ("GRPO gradient health", grad),
            ("Episodes: turns, tool calls, tokens, where they fail", turns),
            ("SFT data per suite", data)) if rs or t == "Held-out pass rate")
    body += "".join(f'<figure><img src="{n}" alt="{n}"></figure>' for n in plots)
    if health:
        body += f"<h2>Verifier health (flywheel tasks audit)</h2>{_html_table(health)}"
    if funnel:
        body += f"<h2>Task factory (flywheel tasks synthesize)</h2>{_html_table(cost)}{_html_table(funnel)}"
    if lineage:
        body += f"<h2>Tasks grown from the student's failures (flywheel.synthesize)</h2>{_html_table(lineage)}"
    body += f"<h2>All round metrics</h2>{_html_table(other)}"
    (folder / "report.html").write_text(
        f"<!doctype html><meta charset=utf-8><title>flywheel {html.escape(run_id)}</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:2px 8px;text-align:right}img{max-width:48%;margin:4px}</style>"
        f"<h1>flywheel run {html.escape(run_id)}</h1>{body}")
    return Report(folder=str(folder), markdown=markdown, markdown_path=str(folder / "report.md"),
                  html_path=str(folder / "report.html"), plots=[str(folder / n) for n in plots])


def _html_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "<p><em>none yet</em></p>"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c, '')))}</td>" for c in cols) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
