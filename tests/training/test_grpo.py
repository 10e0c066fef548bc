"""GRPO on TRL with our sandboxes and verifiers: seeded runs repeat their loss sequence; hacks never score > 0;
every episode GRPO scores is a lake row (a seeded re-run adds none), queried through `flywheel sql`; the update
check sees an overshooting step; the GPU path fails with a message naming the fix when vLLM is missing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time

import pytest

from tasks import arithmetic
from tasks.judge.api import RewardConfig
from tests.conftest import FLYWHEEL
from training.config import DiagnosticsThresholds, GRPOConfig, SFTConfig
from training.grpo import EpisodeLog, check_gpu_path, task_rows, train_grpo
from training.sft import TrainingError, train_sft


def test_rows_open_like_the_loop():
    from agents.loop import initial_messages

    t = arithmetic.generate(1, split="train", seed=1)[0]
    cols = task_rows([t])
    assert cols["prompt"][0] == [{"role": m.role, "content": m.content} for m in initial_messages(t)]
    assert cols["environment"] == ["python"]
    with pytest.raises(TrainingError):
        task_rows([])


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_without_the_gpu_extra_names_the_fix():
    with pytest.raises(TrainingError, match=r"flywheel\[gpu\]"):
        check_gpu_path(GRPOConfig(use_vllm=True))
    check_gpu_path(GRPOConfig())  # the CPU path needs nothing


def _process_reward_tasks():
    """Direct answers allowed (no no_tool_use hack), so a barely trained student already earns different rewards."""
    return [t.model_copy(update={"verifier": t.verifier.model_copy(update={"requires_tool": None})})
            for t in arithmetic.generate(4, split="train", seed=9)]


@pytest.fixture(scope="module")
def warm_student(tiny_model, ref_rows, tmp_path_factory):
    """The tiny model after a few SFT steps: it starts to write tool calls, so rollouts differ in reward."""
    out = tmp_path_factory.mktemp("warm") / "sft"
    train_sft(tiny_model, ref_rows, out, SFTConfig(max_steps=80, batch_size=8, learning_rate=1e-2), progress=False)
    return out


@pytest.mark.slow
def test_seeded_grpo_repeats_its_loss_sequence(warm_student, backend, tmp_path):
    tasks = _process_reward_tasks()
    cfg = GRPOConfig(max_steps=2, num_generations=4, prompts_per_step=2, max_completion_length=40,
                     max_tool_calling_iterations=1, learning_rate=1e-3, beta=0.04, seed=5)
    # process terms give rollouts different rewards even before the student can solve anything
    rewards = RewardConfig(outcome_weight=1.0, well_formed_weight=0.5, answer_format_weight=0.5)
    lake = tmp_path / "lake"
    t0 = time.perf_counter()
    a = train_grpo(warm_student, tasks, tmp_path / "a", cfg, backend=backend, rewards=rewards, progress=False,
                   episode_log=EpisodeLog(str(lake), "grpo-test", 1, policy="grpo-r1"))
    # the same run again (a resumed stage starts over): the same episodes, the same ids, no new rows
    b = train_grpo(warm_student, tasks, tmp_path / "b", cfg, backend=backend, rewards=rewards, progress=False,
                   episode_log=EpisodeLog(str(lake), "grpo-test", 1, policy="grpo-r1"))
    print(f"two seeded GRPO runs of {cfg.max_steps} steps: {time.perf_counter() - t0:.1f}s; losses {a.losses}; "
          f"rewards {a.rewards}; verdicts {a.verdicts}")
    assert len(a.losses) == 2 and a.losses == b.losses and a.rewards == b.rewards
    # GRPO's loss is ~0 by construction on fresh samples (ratio 1, advantages centred), so the invariant also
    # covers gradient norms, rewards and the resulting weights
    assert [d["grad_norm"] for d in a.steps_diagnostics] == [d["grad_norm"] for d in b.steps_diagnostics]
    assert any(d["grad_norm"] > 0 for d in a.steps_diagnostics)  # a real update happened
    assert (tmp_path / "a" / "model.safetensors").read_bytes() == (tmp_path / "b" / "model.safetensors").read_bytes()
    assert a.episodes == 2 * 2 * 4 and a.hacks_with_positive_reward == 0
    assert a.steps_diagnostics and a.steps_diagnostics[0]["reward_std"] is not None
    assert (tmp_path / "a" / "model.safetensors").exists()
    assert (a.rows_written, a.rows_skipped) == (16, 0) and (b.rows_written, b.rows_skipped) == (0, 16)
    _check_grpo_rows(lake, a, cfg)


def _sql(lake, q):
    p = subprocess.run([FLYWHEEL, "sql", "--root", str(lake), "--format", "json", q], capture_output=True, text=True,
                       check=False, env=os.environ, timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _check_grpo_rows(lake, res, cfg):
    """The lake's GRPO rows, through the installed `flywheel sql`: per step and verdict, the groups' advantages as
    TRL computes them (reward minus the group mean, over the group std), zero-advantage groups per task."""
    per_step = _sql(lake, "SELECT grpo_step, verdict, count(*) AS n, sum(reward) AS reward FROM trajectories "
                          "WHERE stage = 'grpo' GROUP BY ALL ORDER BY ALL")
    assert sorted({r["grpo_step"] for r in per_step}) == [0, 1]
    for step in (0, 1):
        assert sum(r["n"] for r in per_step if r["grpo_step"] == step) == cfg.num_generations * cfg.prompts_per_step
    counts: dict[str, int] = {}
    for r in per_step:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + r["n"]
    expected = {("infra_error" if k == "infra" else k): v for k, v in res.verdicts.items() if v}
    assert counts == expected, (counts, res.verdicts)
    # each step's mean reward is what TRL logged for it (the rows carry the reward the trainer got)
    for step, logged in enumerate(res.rewards):
        rows = [r for r in per_step if r["grpo_step"] == step and r["verdict"] != "infra_error"]
        assert abs(sum(r["reward"] for r in rows) / sum(r["n"] for r in rows) - logged) < 1e-6
    rows = _sql(lake, "SELECT trajectory_id, source, stage, group_id, task_id, reward, advantage, verdict, "
                      "hack_flags, sample_index, len(messages) AS n_messages FROM trajectories "
                      "WHERE stage = 'grpo' ORDER BY grpo_step, sample_index")
    assert len({r["trajectory_id"] for r in rows}) == len(rows) == res.episodes
    assert all(r["source"] == "student" and r["n_messages"] >= 3 for r in rows)
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["group_id"], []).append(r)
    assert len(groups) == 2 * cfg.prompts_per_step
    for g in groups.values():
        assert len(g) == cfg.num_generations and len({r["task_id"] for r in g}) == 1
        mean = sum(r["reward"] for r in g) / len(g)
        std = (sum((r["reward"] - mean) ** 2 for r in g) / (len(g) - 1)) ** 0.5
        for r in g:
            assert abs(r["advantage"] - (r["reward"] - mean) / (std + 1e-4)) < 1e-4, (r, mean, std)
    zero = _sql(lake, "SELECT task_id, count(*) AS zero_advantage_groups FROM (SELECT task_id, group_id FROM "
                      "trajectories WHERE stage = 'grpo' GROUP BY ALL HAVING max(abs(advantage)) = 0) "
                      "GROUP BY task_id ORDER BY task_id")
    flat = [gid for gid, g in groups.items() if all(r["advantage"] == 0 for r in g)]
    assert sum(z["zero_advantage_groups"] for z in zero) == len(flat)
    assert _sql(lake, "SELECT count(*) AS n FROM trajectories WHERE stage = 'grpo' AND verdict = 'hack' "
                      "AND reward > 0")[0]["n"] == 0


@pytest.mark.slow
def test_update_check_tells_a_sound_step_from_an_overshooting_one(warm_student, backend, tmp_path):
    rewards = RewardConfig(outcome_weight=1.0, well_formed_weight=0.5, answer_format_weight=0.5)
    base = {"max_steps": 1, "num_generations": 4, "prompts_per_step": 2, "max_completion_length": 40,
            "max_tool_calling_iterations": 1, "warmup_ratio": 0.0, "seed": 5}
    runs = {}
    for name, lr in (("sound", 1e-4), ("overshoot", 0.3)):
        runs[name] = train_grpo(warm_student, _process_reward_tasks(), tmp_path / name,
                                GRPOConfig(learning_rate=lr, **base), backend=backend, rewards=rewards, progress=False)
        print(name, lr, {k: runs[name].steps_diagnostics[0][k] for k in
                         ("update_logp_pos", "update_logp_neg", "update_agreement")})
    sound, over = (runs[k].steps_diagnostics[0] for k in ("sound", "overshoot"))
    # the same rollouts (same seed, same weights until the update): only the step size differs
    assert sound["reward"] == over["reward"]
    assert sound["update_logp_pos"] > 0 > sound["update_logp_neg"] and sound["update_agreement"] > 0.5
    assert not any("overshoots" in w for w in runs["sound"].warnings)
    assert over["update_logp_pos"] < -0.5
    assert any("overshoots" in w for w in runs["overshoot"].warnings)
    off = train_grpo(warm_student, _process_reward_tasks(), tmp_path / "off",
                     GRPOConfig(learning_rate=1e-4, update_check=False, **base), backend=backend, rewards=rewards,
                     progress=False)
    assert off.steps_diagnostics[0]["update_logp_pos"] is None


@pytest.mark.slow
def test_exploding_gradient_norms_stop_grpo(warm_student, backend, tmp_path):
    """The real trainer stops at the first step whose gradient norm crosses diagnostics.stop_grad_norm (here a
    limit every real step crosses), with the reason in the result; the seeded test above ran its steps in full
    under the default limit."""
    cfg = GRPOConfig(max_steps=3, num_generations=4, prompts_per_step=2, max_completion_length=40,
                     max_tool_calling_iterations=1, learning_rate=1e-3, seed=5)
    rewards = RewardConfig(outcome_weight=1.0, well_formed_weight=0.5, answer_format_weight=0.5)
    res = train_grpo(warm_student, _process_reward_tasks(), tmp_path / "stop", cfg, backend=backend, rewards=rewards,
                     thresholds=DiagnosticsThresholds(stop_grad_norm=1e-9), progress=False)
    assert res.steps == 1 and len(res.steps_diagnostics) == 1 and res.episodes == 2 * 4
    assert res.stopped and res.stopped.startswith("step 1: grad norm") and "stop_grad_norm 1e-09" in res.stopped
