"""The drift preflight: do a snapshot's stored token ids re-render exactly with the template training will use?

`preflight_rows(tokenizer, rows)` renders each trajectory with the training template, exactly as SFT does
(training.sft.trajectory_conversation + render_conversation: the same codec, template and tokenizer call), and
compares the result with what the policy stored, turn by turn:
- the prompt it saw (`prompt_token_ids[k]`) must be the rendered conversation's prefix of the same length, and the
  completion it wrote (`completion_token_ids[k]`) must follow it token for token (without prompt ids, the
  completion is compared at the position where the rendered assistant turn starts);
- the first token that differs is reported with its position, the message that holds it (index and role), the turn,
  and both tokens. A row that differs anywhere has drift: training on its re-rendered tokens is not training on
  what was sampled, so it is refused for RL (its logprobs belong to other tokens); it stays fine for SFT.
- the loss mask: every token the model generated (each assistant turn from the end of its generation prompt up to
  and including its stop token) must carry loss, and no token of a system, user or tool message may. Tokens that
  carry loss but were never generated (TRL's qwen2_5 training template also trains the newline before and after an
  assistant turn) are counted, not refused.
- `chat_template_hash` on the row against the hash of the tokenizer's chat template (a different template does not
  always change the tokens; when it does, the drift check names the rows).
Rows without stored ids are checked for the mask only and counted as unverified. A row the codec cannot render
(a malformed call, an empty turn: SFT drops those too) is counted as unrenderable.

It reads rows and a tokenizer; it does not train, write rows or change the snapshot.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from agents.transformers_policy import stop_token_ids
from training.sft import render_conversation, training_template, trajectory_conversation
from warehouse import chat
from warehouse.record import Trajectory


class Drift(BaseModel):
    """Where one row's stored tokens and the training render first part ways."""

    trajectory_id: str
    turn: int = Field(description="Assistant turn (0-based) whose stored ids differ.")
    part: str = Field(description="'prompt' (the context the model saw) or 'completion' (what it wrote).")
    position: int = Field(description="Index of the first differing token in the rendered conversation.")
    message: int = Field(description="Index in the row's messages of the message holding that token.")
    role: str = Field(description="That message's role.")
    stored: int | None = Field(description="Stored token id there (None: the stored sequence ended).")
    rendered: int | None = Field(description="Rendered token id there (None: the render ended).")
    stored_text: str = ""
    rendered_text: str = ""

    def line(self) -> str:
        return (f"drift {self.trajectory_id}: turn {self.turn} {self.part}, message {self.message} ({self.role}), "
                f"first differing token at position {self.position}: stored {self.stored} {self.stored_text!r} vs "
                f"rendered {self.rendered} {self.rendered_text!r}")


class MaskProblem(BaseModel):
    trajectory_id: str
    message: int
    role: str
    problem: str

    def line(self) -> str:
        return f"mask {self.trajectory_id}: message {self.message} ({self.role}): {self.problem}"


class PreflightReport(BaseModel):
    rows: int
    with_ids: int = Field(description="Rows carrying stored token ids (checked for drift).")
    drifted: list[Drift] = Field(default_factory=list, description="First difference of each drifted row.")
    mask_problems: list[MaskProblem] = Field(default_factory=list)
    unrenderable: list[str] = Field(default_factory=list, description="Rows the codec cannot render (SFT drops them).")
    template_mismatch: list[str] = Field(default_factory=list,
                                         description="Rows whose chat_template_hash is not the tokenizer's.")
    trained_outside_completion: int = Field(default=0, description="Loss-carrying tokens the model never generated "
                                                                   "(inside assistant messages).")
    template_hash: str | None = None

    @property
    def drift_share(self) -> float:
        return len(self.drifted) / self.with_ids if self.with_ids else 0.0

    @property
    def rl_refused(self) -> list[str]:
        return sorted({d.trajectory_id for d in self.drifted})

    @property
    def clean(self) -> bool:
        return not self.drifted and not self.mask_problems

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows, "with_ids": self.with_ids, "drifted": len(self.drifted),
                "drift_share": round(self.drift_share, 4), "rl_refused": self.rl_refused,
                "mask_problems": len(self.mask_problems), "unrenderable": len(self.unrenderable),
                "unverified": self.rows - self.with_ids - len(self.unrenderable),
                "template_mismatch": len(self.template_mismatch),
                "trained_outside_completion": self.trained_outside_completion, "template_hash": self.template_hash}


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where a and b differ, counting a shorter one's end; None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def check_row(tokenizer, row: Trajectory, template: str | None, *, stops: set[int], report: PreflightReport) -> None:
    """Check one row and add what it finds to `report` (see the module docstring)."""
    try:
        msgs, tools = trajectory_conversation(row, template=tokenizer.chat_template)
    except chat.ConversationError:
        report.unrenderable.append(row.trajectory_id)
        return
    ids, mask = render_conversation(tokenizer, msgs, tools, template)
    ends = [len(render_conversation(tokenizer, msgs[: i + 1], tools, template, mask=False)[0])
            for i in range(len(msgs))]
    starts = [0, *ends[:-1]]

    def where(pos: int) -> int:
        return next((i for i, e in enumerate(ends) if pos < e), len(msgs) - 1)

    def tok(seq: list[int], pos: int) -> tuple[int | None, str]:
        return (seq[pos], tokenizer.decode([seq[pos]])) if pos < len(seq) else (None, "")

    stored_prompts = row.prompt_token_ids or []
    stored_completions = row.completion_token_ids or []
    has_ids = any(stored_prompts) or any(stored_completions)
    report.with_ids += bool(has_ids)
    drift: Drift | None = None
    trained = [False] * len(ids)
    turn = -1
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            if any(mask[starts[i]:ends[i]]):
                report.mask_problems.append(MaskProblem(
                    trajectory_id=row.trajectory_id, message=i, role=m["role"],
                    problem=f"{sum(mask[starts[i]:ends[i]])} token(s) of a {m['role']} message carry loss"))
            continue
        turn += 1
        gen_end = len(render_conversation(tokenizer, msgs[:i], tools, template, mask=False,
                                          generation_prompt=True)[0])
        prompt = stored_prompts[turn] if turn < len(stored_prompts) else []
        completion = stored_completions[turn] if turn < len(stored_completions) else []
        if drift is None and prompt:
            at = _first_difference(prompt, ids[: len(prompt)])
            if at is not None:
                (s, st), (r, rt) = tok(prompt, at), tok(ids, at)
                drift = Drift(trajectory_id=row.trajectory_id, turn=turn, part="prompt", position=at,
                              message=where(at), role=msgs[where(at)]["role"], stored=s, rendered=r,
                              stored_text=st, rendered_text=rt)
        begin = len(prompt) if prompt else gen_end
        if drift is None and completion:
            at = _first_difference(completion, ids[begin: begin + len(completion)])
            if at is not None:
                (s, st), (r, rt) = tok(completion, at), tok(ids, begin + at)
                drift = Drift(trajectory_id=row.trajectory_id, turn=turn, part="completion", position=begin + at,
                              message=where(begin + at), role=msgs[where(begin + at)]["role"], stored=s, rendered=r,
                              stored_text=st, rendered_text=rt)
        # what the model generates: from the generation prompt's end up to and including the first stop token
        end = next((j + 1 for j in range(gen_end, ends[i]) if ids[j] in stops), ends[i])
        untrained = [j for j in range(gen_end, end) if not mask[j]]
        if untrained:
            report.mask_problems.append(MaskProblem(
                trajectory_id=row.trajectory_id, message=i, role="assistant",
                problem=f"{len(untrained)} generated token(s) carry no loss (first at position {untrained[0]})"))
        for j in range(gen_end, end):
            trained[j] = True
    report.trained_outside_completion += sum(1 for j, b in enumerate(mask) if b and not trained[j])
    if drift is not None:
        report.drifted.append(drift)


def preflight_rows(tokenizer, rows: list[Trajectory]) -> PreflightReport:
    """Check every row against the training render of `tokenizer` (see the module docstring)."""
    template = training_template(tokenizer)
    report = PreflightReport(rows=len(rows), with_ids=0, template_hash=chat.template_hash(tokenizer.chat_template))
    stops = set(stop_token_ids(tokenizer)) - {tokenizer.unk_token_id}
    for row in rows:
        if row.chat_template_hash and row.chat_template_hash != report.template_hash:
            report.template_mismatch.append(row.trajectory_id)
        check_row(tokenizer, row, template, stops=stops, report=report)
    return report


def preflight_snapshot(root: str, snapshot_id: str, model: str) -> PreflightReport:
    """The preflight of snapshot `snapshot_id` of lake `root` against the tokenizer of `model` (folder or id)."""
    from transformers import AutoTokenizer

    from training.sft import TrainingError, load_snapshot

    rows = load_snapshot(root, snapshot_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except (OSError, ValueError) as e:
        raise TrainingError(f"cannot load a tokenizer from {model!r} ({e}); pass --model the folder SFT/GRPO "
                            "will train") from None
    return preflight_rows(tokenizer, rows)
