"""The GRPO environment: the loop's exact tool schemas, tool calls in real sandboxes, verifier rewards, hack -> 0."""

from __future__ import annotations

import json

import pytest

from tasks import arithmetic
from tasks.tools import tool_schemas
from training.environment import EnvironmentError_, EpisodeReward, completion_messages, environment_class


def test_schemas_match_the_loop_byte_for_byte():
    from transformers.utils.chat_template_utils import get_json_schema

    cls = environment_class(["python"], backend=None)
    assert json.dumps(get_json_schema(cls.python)) == json.dumps(tool_schemas(["python"])[0])
    public = [n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))]
    assert sorted(public) == ["python", "reset"]  # no other method leaks in as a tool


def test_unsupported_schema_is_refused():
    with pytest.raises((EnvironmentError_, ValueError)):
        environment_class(["no_such_tool"], backend=None)


def _episode(env_cls, task, code: str | None, final: str):
    env = env_cls()
    env.reset(task_json=task.model_dump_json(), prompt=[])
    completion = []
    if code is not None:
        out = env.python(code=code)
        completion += [{"role": "assistant", "content": "",
                        "tool_calls": [{"type": "function", "function": {"name": "python",
                                                                           "arguments": {"code": code}}}]},
                       {"role": "tool", "name": "python", "content": out}]
    completion.append({"role": "assistant", "content": final})
    return env, completion


def test_tools_run_in_the_sandbox_and_the_verifier_scores(backend):
    task = arithmetic.generate(1, split="train", seed=5)[0]
    cls = environment_class(task.tools, backend)
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": task.prompt}]
    good_env, good = _episode(cls, task, task.reference.steps[0].arguments["code"], task.reference.final)
    assert good[1]["content"] == task.verifier.answer  # the sandbox really ran print(a op b)
    wrong_env, wrong = _episode(cls, task, task.reference.steps[0].arguments["code"], "Answer: -1")
    hack_env, hack = _episode(cls, task, None, task.reference.final)  # right answer, tool never used
    reward = EpisodeReward(backend=backend)
    got = reward([prompt] * 3, [good, wrong, hack], environments=[good_env, wrong_env, hack_env])
    assert got == [1.0, 0.0, 0.0]
    assert reward.last_verdicts == ["pass", "fail", "hack"]
    assert reward.stats["hack"] == 1 and reward.history[2]["hack_flags"]
    assert all(e.sandbox is None for e in (good_env, wrong_env, hack_env))  # closed after scoring


def test_a_tool_call_trl_could_not_parse_is_a_model_error_not_a_hack(backend):
    task = arithmetic.generate(1, split="train", seed=5)[0]
    cls = environment_class(task.tools, backend)
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": task.prompt}]
    bad = '<tool_call>\n{"name": "python": "arguments": {"code": "print(1)"}}\n</tool_call>'  # invalid JSON
    env, _ = _episode(cls, task, None, task.reference.final)
    direct_env, direct = _episode(cls, task, None, task.reference.final)  # a real no-tool answer stays a hack
    reward = EpisodeReward(backend=backend)
    got = reward([prompt] * 2, [[{"role": "assistant", "content": bad}], direct], environments=[env, direct_env])
    assert got == [0.0, 0.0]
    assert reward.last_verdicts == ["model_error", "hack"]
    assert reward.stats["model_error"] == 1 and reward.stats["hack"] == 1


def test_completion_messages_keep_call_ids_paired():
    msgs = completion_messages([
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "python", "arguments": {"code": "print(1)"}}}]},
        {"role": "tool", "name": "python", "content": "1"},
        {"role": "assistant", "content": "Answer: 1"},
    ])
    assert msgs[0].tool_calls[0].id == msgs[1].tool_call_id
    assert json.loads(msgs[0].tool_calls[0].function.arguments) == {"code": "print(1)"}
    assert msgs[2].content == "Answer: 1" and msgs[0].content is None


def test_rewards_only_from_trusted_verdict_strengths(backend):
    """GRPOConfig.reward_strengths: a verdict reached on a path the config does not trust scores None (left out by
    TRL) and is counted; numeric answers are compared on the host, so they are 'data'."""
    task = arithmetic.generate(1, split="train", seed=5)[0]
    cls = environment_class(task.tools, backend)
    prompt = [{"role": "user", "content": task.prompt}]
    code = task.reference.steps[0].arguments["code"]
    env, good = _episode(cls, task, code, task.reference.final)
    assert EpisodeReward(backend=backend, strengths=("data",))([prompt], [good], environments=[env]) == [1.0]
    env, good = _episode(cls, task, code, task.reference.final)
    reward = EpisodeReward(backend=backend, strengths=("isolated",))
    assert reward([prompt], [good], environments=[env]) == [None]
    assert reward.last_verdicts == ["weak_verdict"] and reward.stats["weak_verdict"] == 1
    assert env.sandbox is None  # closed all the same


def test_every_scored_generation_becomes_a_row_like_the_loops(backend):
    """grpo_rows: pass, fail, hack, model_error and an injected infrastructure failure are each a row (source
    student, stage grpo, step, group, the advantage given), with the loop's fields; a hack's reward is 0."""
    from training.environment import grpo_rows

    task = arithmetic.generate(1, split="train", seed=5)[0]
    cls = environment_class(task.tools, backend)
    prompt = [{"role": "system", "content": "s"}, {"role": "user", "content": task.prompt}]
    code = task.reference.steps[0].arguments["code"]
    good_env, good = _episode(cls, task, code, task.reference.final)
    wrong_env, wrong = _episode(cls, task, code, "Answer: -1")
    hack_env, hack = _episode(cls, task, None, task.reference.final)
    broken_env, broken = _episode(cls, task, code, task.reference.final)
    broken_env.infra_error = "SandboxError: injected by the test"  # fault injection: the sandbox died mid-episode
    bad_env, _ = _episode(cls, task, None, task.reference.final)
    bad = [{"role": "assistant", "content": '<tool_call>\n{"name": "python": 1}\n</tool_call>'}]
    reward = EpisodeReward(backend=backend)
    got = reward([prompt] * 5, [good, wrong, hack, broken, bad],
                 environments=[good_env, wrong_env, hack_env, broken_env, bad_env])
    assert got == [1.0, 0.0, 0.0, None, 0.0]
    adv = [1.5, -0.5, -0.5, 0.0, -0.5]
    rows = grpo_rows(reward.last_episodes, adv, step=3, num_generations=5, run_id="r", round=2, policy="grpo-r2",
                     sampling={"temperature": 1.0})
    assert [r.verdict for r in rows] == ["pass", "fail", "hack", "infra_error", "model_error"]
    assert [r.reward for r in rows] == [1.0, 0.0, 0.0, 0.0, 0.0] and [r.advantage for r in rows] == adv
    assert all(r.source == "student" and r.stage == "grpo" and r.grpo_step == 3 and r.round == 2 for r in rows)
    assert len({r.group_id for r in rows}) == 1 and len({r.trajectory_id for r in rows}) == 5
    assert rows[0].success and rows[0].verifier_strength == "data" and rows[0].n_tool_calls == 1
    assert rows[0].messages[-1].content == task.reference.final and json.loads(rows[0].tools_json)
    assert rows[0].sandbox_backend == backend.name
    assert rows[2].hack_flags and not rows[2].success
    assert rows[3].error_class == "SandboxInfraError" and "injected" in rows[3].error_message
    assert rows[4].error_class == "MalformedToolCall"
    # the same batch again gives the same ids; another step gives others
    again = grpo_rows(reward.last_episodes, adv, step=3, num_generations=5, run_id="r", round=2, policy="grpo-r2",
                      sampling={})
    later = grpo_rows(reward.last_episodes, adv, step=4, num_generations=5, run_id="r", round=2, policy="grpo-r2",
                      sampling={})
    assert [r.trajectory_id for r in again] == [r.trajectory_id for r in rows]
    assert not {r.trajectory_id for r in later} & {r.trajectory_id for r in rows}
    with pytest.raises(ValueError, match="advantages"):
        grpo_rows(reward.last_episodes, adv[:2], step=3, num_generations=5, run_id="r", round=2, policy="p",
                  sampling={})
