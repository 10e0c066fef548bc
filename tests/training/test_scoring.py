"""training/scoring.py, the one scoring path: what a score is made of (greedy, sampled, pass@k), the policies it
builds from the [student] settings, and a real run of reference episodes in sandboxes through `run_in_memory`."""

from __future__ import annotations

import pytest

from agents.config import RolloutConfig
from tasks import arithmetic
from training.config import StudentConfig
from training.scoring import Sampling, run_in_memory, score_checkpoint, score_policy, student_policy
from warehouse.record import Trajectory


def _row(task_id: str, verdict: str, policy: str, difficulty: int = 1, i: int = 0) -> Trajectory:
    return Trajectory(trajectory_id=f"{policy}-{task_id}-{i}", run_id="r", source="student", policy=policy,
                      task_id=task_id, suite="arithmetic", difficulty=difficulty, split="heldout", task_version="1",
                      verifier="v", verifier_version="1", messages=[], verdict=verdict,
                      reward=1.0 if verdict == "pass" else 0.0)


class _Recorder:
    """An episode runner double: records (policy name, temperature, seed, samples) and returns canned verdicts
    (the greedy policy passes task a only; the sampled one passes a always and b once in k)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, tasks, policy, samples):
        self.calls.append((policy.name, policy.temperature, policy.seed, samples, len(tasks)))
        rows = []
        for t in tasks:
            for i in range(samples):
                ok = t.id == tasks[0].id or (samples > 1 and i == 0)
                rows.append(_row(t.id, "pass" if ok else "fail", policy.name, i=i))
        rows.append(_row(tasks[0].id, "infra_error", policy.name, i=99))  # never scored
        return rows


def test_score_checkpoint_greedy_then_sampled_with_pass_k(tiny_model):
    tasks = arithmetic.generate(2, split="heldout", seed=1)
    run = _Recorder()
    res = score_checkpoint(tiny_model, tasks, student=StudentConfig(), run=run, name="student-r1-sft",
                           sampling=Sampling(k=4, temperature=0.8, seed=1))
    assert run.calls == [("student-r1-sft", 0.0, 0, 1, 2), ("student-r1-sft-t0.8", 0.8, 1, 4, 2)]
    all_ = {s.suite: s for s in res.greedy.scores}["all"]
    assert (all_.metric, all_.value, all_.episodes) == ("pass@1", 0.5, 2)  # the infra_error row is not scored
    assert res.greedy.verdicts == {"pass": 1, "fail": 1, "infra_error": 1}
    assert res.sampled is not None and res.sampled.pass_rate == pytest.approx(5 / 8)
    assert {(s.suite, s.metric, s.value) for s in res.pass_k} == {("all", "pass@4", 1.0),
                                                                 ("arithmetic-d1", "pass@4", 1.0)}


def test_score_checkpoint_without_sampling_and_k1(tiny_model):
    tasks = arithmetic.generate(2, split="heldout", seed=1)
    run = _Recorder()
    greedy_only = score_checkpoint(tiny_model, tasks, student=StudentConfig(), run=run, name="eval",
                                   sampling=None)
    assert greedy_only.sampled is None and greedy_only.pass_k == [] and len(run.calls) == 1
    k1 = score_checkpoint(tiny_model, tasks, student=StudentConfig(), run=run, name="eval",
                          sampling=Sampling(k=1, temperature=0.5, seed=3))
    assert k1.sampled is not None and k1.pass_k == []


def test_student_policy_takes_the_student_settings(tiny_model):
    s = StudentConfig(max_new_tokens=7, batch_size=3, threads=None, thinking=False)
    p = student_policy(s, tiny_model, "x", temperature=0.3, seed=5)
    assert (p.name, p.temperature, p.seed, p.max_new_tokens, p.batch_size, p.template_kwargs) == \
        ("x", 0.3, 5, 7, 3, {"enable_thinking": False})


def test_reference_episodes_scored_in_memory(backend):
    from agents.reference import ReferencePolicy

    tasks = arithmetic.generate(3, split="heldout", seed=2)
    run = run_in_memory(backend, RolloutConfig(concurrency=2), run_id="score-test", round=0)
    res = score_policy(ReferencePolicy(), tasks, run=run)
    assert res.pass_rate == 1.0 and res.verdicts == {"pass": 3} and res.mean_reward == 1.0
    assert {(s.suite, s.episodes) for s in res.scores} == {("all", 3), ("arithmetic-d1", 3)}
    assert {r.task_id for r in res.rows} == {t.id for t in tasks} and res.wall_s > 0
