"""The promotion rules of a round: which of its checkpoints is the candidate, and whether the candidate replaces
the incumbent.

A round trains an SFT checkpoint and, with GRPO, a GRPO checkpoint from it. `choose_promotion` (the SFT-only
control, `flywheel.promote`) picks the round's candidate between the two from their held-out scores.
`against_incumbent` then decides whether that candidate replaces the incumbent (the student the round started
from: the base in round 1), from both models' held-out scores per suite (`HeldoutScores`, read from the rounds
table's rows): the candidate must be not worse on any suite the incumbent was scored on, beyond the noise of two
binomial scores (`flywheel.incumbent_z` standard errors of their difference), on greedy and, where both were
measured, sampled pass@1, and better on the whole held-out set (greedy pass@1 higher, or equal with a higher
sampled pass@1). Otherwise the next round starts from the incumbent. Both return the choice, a reason code and the
reason in words with the numbers. Pure functions: this module reads and writes nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

PromoteRule = Literal["grpo_unless_worse", "grpo", "sft"]

# Reason codes of against_incumbent.
CANDIDATE_BETTER = "candidate_better"
CANDIDATE_WORSE_ON_SUITE = "candidate_worse_on_suite"
CANDIDATE_NOT_BETTER = "candidate_not_better"
INCUMBENT_UNSCORED = "incumbent_unscored"
NO_CANDIDATE = "no_candidate"


class Promotion(BaseModel):
    """Which checkpoint of a round goes on, and why."""

    choice: Literal["sft", "grpo"]
    code: str = Field(description="Reason code: grpo_not_worse, grpo_worse_than_margin, grpo_greedy_lower, "
                      "rule_grpo, rule_sft.")
    reason: str = Field(description="The reason in words, with the numbers.")
    gain_sampled: float = Field(description="GRPO's held-out sampled pass@1 minus SFT's.")
    gain_sampled_se: float = Field(description="Standard error of that difference (two binomial proportions).")
    gain_greedy: float = Field(description="GRPO's held-out greedy pass@1 minus SFT's.")


def diff_se(p1: float, n1: int, p2: float, n2: int) -> float:
    """Standard error of the difference of two binomial proportions p1 (n1 trials) and p2 (n2 trials)."""
    return (p1 * (1 - p1) / max(1, n1) + p2 * (1 - p2) / max(1, n2)) ** 0.5


def choose_promotion(rule: PromoteRule, margin: float, *, sft_greedy: float, grpo_greedy: float,
                     sft_sampled: float, grpo_sampled: float, sft_n: int, grpo_n: int,
                     greedy_margin: float = 0.0) -> Promotion:
    """The SFT-vs-GRPO rule: 'grpo_unless_worse' keeps GRPO's checkpoint unless its held-out sampled pass@1 is
    below SFT's by more than `margin`, or its greedy pass@1 is below SFT's by more than `greedy_margin` (0: any
    drop); 'grpo' / 'sft' always pick that one. sft_n / grpo_n: the sampled episodes scored (for the standard error
    of the gain, reported beside it)."""
    gain = grpo_sampled - sft_sampled
    se = diff_se(sft_sampled, sft_n, grpo_sampled, grpo_n)
    nums = (f"held-out sampled pass@1 GRPO {grpo_sampled:.3f} vs SFT {sft_sampled:.3f} (gain {gain:+.3f} "
            f"+- {se:.3f}), greedy GRPO {grpo_greedy:.3f} vs SFT {sft_greedy:.3f}")
    common = {"gain_sampled": gain, "gain_sampled_se": se, "gain_greedy": grpo_greedy - sft_greedy}
    if rule == "grpo":
        return Promotion(choice="grpo", code="rule_grpo", reason=f"flywheel.promote = 'grpo': GRPO's; {nums}",
                         **common)
    if rule == "sft":
        return Promotion(choice="sft", code="rule_sft", reason=f"flywheel.promote = 'sft': SFT's; {nums}", **common)
    if gain < -margin:
        return Promotion(choice="sft", code="grpo_worse_than_margin",
                         reason=f"SFT's: GRPO is worse by more than the margin {margin:g}; {nums}", **common)
    if grpo_greedy < sft_greedy - greedy_margin - 1e-9:
        return Promotion(choice="sft", code="grpo_greedy_lower",
                         reason=f"SFT's: GRPO's greedy pass@1 is below SFT's by more than the greedy margin "
                                f"{greedy_margin:g}; {nums}", **common)
    return Promotion(choice="grpo", code="grpo_not_worse",
                     reason=f"GRPO's: not worse than SFT's by more than the margin {margin:g} (sampled) or "
                            f"{greedy_margin:g} (greedy); {nums}", **common)


class SuiteScore(BaseModel):
    """One model's held-out score on one suite label (or 'all'): greedy pass@1 over its tasks and, when measured,
    sampled pass@1 over its sampled episodes."""

    greedy: float
    greedy_n: int = Field(description="Greedy episodes scored (one per task).")
    sampled: float | None = None
    sampled_n: int = 0


class HeldoutScores(BaseModel):
    """A model's held-out scores per suite label ('arithmetic-d1', ..., and 'all')."""

    suites: dict[str, SuiteScore] = Field(default_factory=dict)

    @classmethod
    def from_metrics(cls, rows: list[dict[str, Any]]) -> HeldoutScores:
        """From rounds-table rows of one subject on the held-out split (metric pass@1 / episodes and
        sampled_pass@1 / sampled_episodes per suite, as flows.stages.score_rows writes them)."""
        by: dict[str, dict[str, float]] = {}
        for r in rows:
            if r.get("split", "heldout") == "heldout":
                by.setdefault(r["suite"], {})[r["metric"]] = float(r["value"])
        out = {}
        for suite, m in sorted(by.items()):
            if "pass@1" not in m:
                continue
            sampled = m.get("sampled_pass@1")
            out[suite] = SuiteScore(greedy=m["pass@1"], greedy_n=int(m.get("episodes", 0)), sampled=sampled,
                                    sampled_n=int(m.get("sampled_episodes", 0)) if sampled is not None else 0)
        return cls(suites=out)


class SuiteDelta(BaseModel):
    """Candidate minus incumbent on one suite, with the standard errors the verdict used."""

    suite: str
    greedy_delta: float
    greedy_se: float
    sampled_delta: float | None = None
    sampled_se: float | None = None
    worse: bool = Field(description="The candidate is below the incumbent beyond z standard errors (greedy or "
                                    "sampled).")


class IncumbentDecision(BaseModel):
    """Whether a round's candidate replaces the incumbent, and why."""

    promoted: bool
    code: str = Field(description="candidate_better, candidate_worse_on_suite, candidate_not_better, "
                                  "incumbent_unscored or no_candidate.")
    reason: str
    deltas: list[SuiteDelta] = Field(default_factory=list)


def against_incumbent(candidate: HeldoutScores, incumbent: HeldoutScores, *, z: float) -> IncumbentDecision:
    """The candidate replaces the incumbent only when it is not worse on any suite the incumbent was scored on
    (greedy, and sampled where both were measured) by more than z standard errors of the difference, and better on
    'all' (greedy pass@1 higher, or equal and sampled pass@1 higher). An incumbent with no scores (a run whose
    earlier rounds wrote none) is replaced, with its own code."""
    if "all" not in incumbent.suites:
        return IncumbentDecision(promoted=True, code=INCUMBENT_UNSCORED,
                                 reason="the incumbent has no held-out scores; the candidate goes on")
    deltas: list[SuiteDelta] = []
    missing = [s for s in incumbent.suites if s not in candidate.suites]
    for suite, inc in incumbent.suites.items():
        cand = candidate.suites.get(suite)
        if cand is None:
            continue
        g_se = diff_se(cand.greedy, cand.greedy_n, inc.greedy, inc.greedy_n)
        worse = cand.greedy < inc.greedy - z * g_se - 1e-9
        s_delta = s_se = None
        if cand.sampled is not None and inc.sampled is not None:
            s_delta = cand.sampled - inc.sampled
            s_se = diff_se(cand.sampled, cand.sampled_n, inc.sampled, inc.sampled_n)
            worse = worse or s_delta < -z * s_se - 1e-9
        deltas.append(SuiteDelta(suite=suite, greedy_delta=cand.greedy - inc.greedy, greedy_se=g_se,
                                 sampled_delta=s_delta, sampled_se=s_se, worse=worse))

    def show(d: SuiteDelta) -> str:
        s = f"{d.suite} greedy {d.greedy_delta:+.3f} (se {d.greedy_se:.3f})"
        return s + (f", sampled {d.sampled_delta:+.3f} (se {d.sampled_se:.3f})" if d.sampled_delta is not None
                    else "")

    nums = "; ".join(show(d) for d in deltas)
    if missing:
        return IncumbentDecision(promoted=False, code=CANDIDATE_WORSE_ON_SUITE, deltas=deltas,
                                 reason=f"the candidate was not scored on {', '.join(missing)}, where the incumbent "
                                        f"was; the incumbent stays")
    bad = [d.suite for d in deltas if d.worse and d.suite != "all"]
    if bad:
        return IncumbentDecision(promoted=False, code=CANDIDATE_WORSE_ON_SUITE, deltas=deltas,
                                 reason=f"the candidate is worse than the incumbent on {', '.join(bad)} beyond "
                                        f"{z:g} standard errors; the incumbent stays ({nums})")
    c, i = candidate.suites["all"], incumbent.suites["all"]
    better = c.greedy > i.greedy + 1e-9 or (abs(c.greedy - i.greedy) <= 1e-9 and c.sampled is not None
                                            and i.sampled is not None and c.sampled > i.sampled + 1e-9)
    if not better:
        return IncumbentDecision(promoted=False, code=CANDIDATE_NOT_BETTER, deltas=deltas,
                                 reason=f"the candidate is not better than the incumbent on the whole held-out set; "
                                        f"the incumbent stays ({nums})")
    return IncumbentDecision(promoted=True, code=CANDIDATE_BETTER, deltas=deltas,
                             reason=f"the candidate is better on the whole held-out set and not worse on any suite "
                                    f"beyond {z:g} standard errors ({nums})")


def no_candidate(why: str) -> IncumbentDecision:
    """The decision of a round that trained no candidate (`why`: its snapshot held no example): the incumbent
    stays."""
    return IncumbentDecision(promoted=False, code=NO_CANDIDATE, reason=f"{why}; no candidate was trained, the "
                                                                       f"incumbent stays")
