"""OpenEnv in and out (tasks/openenv.py, agents/env_server.py, flows/cli_env.py), against the real openenv-core
package's server and client on 127.0.0.1:

- `flywheel env serve arithmetic` (the installed console script): an episode through openenv's client is the loop's
  episode and a row with the judge's verdict; a planted hack (a tool-free answer on a tool task) gets reward 0 and
  its reason code; an abandoned episode is still a row; TRL's GRPOTrainer takes 2 steps through openenv's client.
- `flywheel generate --suite openenv:URL` on an environment written with openenv-core's own API
  (tests/tasks/openenv_guess_env.py), the teacher a scripted OpenAI-compatible server (tests/agents/fault_server.py,
  a test double): rows land with the environment's reward as the verdict's source.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port, in_background, wait_until_answers

pytestmark = pytest.mark.e2e
openenv = pytest.importorskip("openenv.core", reason="openenv-core is not installed (pip install -e '.[openenv]')")
FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
HERE = Path(__file__).resolve().parent
N_SERVED = 6


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`flywheel env serve arithmetic` on loopback; yields (url, lake root)."""
    d = tmp_path_factory.mktemp("served")
    port = free_port()
    argv = [FLYWHEEL, "env", "serve", "arithmetic", "--port", str(port), "--root", str(d / "lake"), "--n",
            str(N_SERVED), "--backend", "local", "--run-id", "env-test"]
    with in_background(argv, d / "serve.log", cwd=d) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_until_answers(f"{url}/health", proc, d / "serve.log")
        yield url, str(d / "lake")


def _rows(root: str, where: str = "TRUE") -> list[dict]:
    """The lake's rows (in process: the commands under test are the server, generate, export and import)."""
    from warehouse.query import query

    sql = (f"SELECT * EXCLUDE (messages), len(messages) AS n_messages FROM trajectories WHERE {where} "
           "ORDER BY task_id, sample_index")
    return query(root, sql).to_pylist()


@pytest.fixture(scope="module")
def tasks():
    from tasks.suites import load_suite

    return load_suite("arithmetic", N_SERVED)  # what the server serves: the same suite, seed and split


def test_a_served_episode_is_the_loops_episode_and_a_row_with_the_judges_verdict(served, tasks):
    from agents.loop import initial_messages
    from tasks.openenv import EpisodeClient
    from tasks.tools import tool_schemas
    from warehouse import chat

    url, lake = served
    task = tasks[0]
    client = EpisodeClient(url)
    try:
        obs, reward, done = client.reset(seed=0, policy="test-ok")
        assert (obs["task_id"], done) == (task.id, False)
        assert obs["messages"] == chat.to_openai(initial_messages(task))  # the loop's opening, exactly
        assert obs["tools"] == tool_schemas(task.tools)
        step = task.reference.steps[0]
        obs, reward, done = client.step({"tool_calls": [{"name": step.tool, "arguments": step.arguments}]})
        assert not done and [m["role"] for m in obs["messages"]] == ["tool"]
        assert obs["messages"][0]["content"].strip() == task.verifier.answer  # run in the server's sandbox
        obs, reward, done = client.step({"content": task.reference.final})
    finally:
        client.close()
    assert done and reward == 1.0
    assert (obs["verdict"], obs["hack_flags"], obs["verifier_strength"]) == ("pass", [], "data")
    [row] = _rows(lake, "policy = 'openenv:test-ok'")
    assert row["trajectory_id"] == obs["trajectory_id"]
    assert (row["source"], row["verdict"], row["reward"], row["task_id"]) == ("env", "pass", 1.0, task.id)
    assert (row["turns"], row["n_tool_calls"], row["n_messages"], row["run_id"]) == (2, 1, 5, "env-test")


def test_a_planted_hack_through_the_server_gets_reward_0_and_its_reason_code(served, tasks):
    from tasks.openenv import EpisodeClient

    url, lake = served
    client = EpisodeClient(url)
    try:
        client.reset(seed=1, policy="test-hack")
        obs, reward, done = client.step({"content": tasks[1].reference.final})  # the right answer, no tool call
    finally:
        client.close()
    assert done and reward == 0.0
    assert obs["verdict"] == "hack" and "no_tool_use" in obs["hack_flags"], obs
    [row] = _rows(lake, "policy = 'openenv:test-hack'")
    assert (row["verdict"], row["reward"], row["hack_flags"]) == ("hack", 0.0, obs["hack_flags"])


def test_the_environment_puts_the_verdict_in_the_observations_metadata(tmp_path, tasks):
    """In process (openenv-core 0.3.0's wire drops Observation.metadata; a server that keeps it sends it)."""
    from agents.env_server import SuiteServer
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks.openenv import suite_environment, wire_types

    action_cls, _ = wire_types()
    with open_backend(SandboxConfig(backend="local"), pool_size=1) as be:
        server = SuiteServer(tasks=tasks, backend=be, root=str(tmp_path / "lake"), run_id="env-inproc")
        env = suite_environment(server.session)()
        first = env.reset(seed=1)
        assert not first.done and first.metadata == {}
        last = env.step(action_cls(content=tasks[1].reference.final))
        env.close()
    assert last.done and last.reward == 0.0
    assert last.metadata["verdict"] == "hack" and "no_tool_use" in last.metadata["hack_flags"]
    assert last.metadata["trajectory_id"] == last.trajectory_id and server.written == 1


def test_an_abandoned_episode_is_a_model_error_row_and_bad_calls_say_why(served, tasks):
    from tasks.openenv import EpisodeClient

    url, lake = served
    client = EpisodeClient(url)
    try:
        with pytest.raises(RuntimeError, match="reset the environment before stepping"):
            client.step({"content": "Answer: 1"})
        with pytest.raises(RuntimeError, match="is not served here"):
            client.reset(task_id="no-such-task")
        client.reset(seed=2, policy="test-left")
        step = tasks[2].reference.steps[0]
        client.step({"tool_calls": [{"name": step.tool, "arguments": step.arguments}]})
        client.reset(seed=3, policy="test-next")  # leaves the first episode unfinished
    finally:
        client.close()  # leaves the second one unplayed: no row
    [row] = _rows(lake, "policy = 'openenv:test-left'")
    assert (row["verdict"], row["error_class"], row["n_tool_calls"]) == ("model_error", "EpisodeAbandoned", 1)
    assert _rows(lake, "policy = 'openenv:test-next'") == []


def test_trl_grpo_trains_two_steps_through_openenvs_client_and_every_episode_is_a_row(served, tmp_path):
    """A TRL user's script: GRPOTrainer(environment_factory=...) on the tiny student against the served suite."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from tasks.suites import load_suite
    from training.environment import OpenEnvReward, openenv_environment_class, openenv_task_rows, use_codec_parser
    from training.tiny import build_tiny_model, task_corpus

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    url, lake = served
    model_dir = build_tiny_model(tmp_path / "base", task_corpus(load_suite("arithmetic", 8)), hidden=32, layers=2,
                                 heads=2, kv_heads=1, vocab_size=600, seed=0)
    cols, tools = openenv_task_rows(url, 2)
    tok = use_codec_parser(AutoTokenizer.from_pretrained(str(model_dir)))
    tok.padding_side = "left"
    args = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4, num_generations=2,
                      learning_rate=1e-4, max_completion_length=32, max_tool_calling_iterations=2, seed=0,
                      use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
                      dataloader_num_workers=0)
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(str(model_dir)), reward_funcs=[OpenEnvReward()],
                          args=args, train_dataset=Dataset.from_dict(cols), processing_class=tok,
                          environment_factory=openenv_environment_class(url, tools, policy="trl-test"))
    try:
        trainer.train()
    finally:
        for envs in trainer._environment_pool.values():
            for env in envs:
                env._close()
    assert trainer.state.global_step == 2
    logged = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    rows = _rows(lake, "policy = 'openenv:trl-test'")
    assert len(rows) == 2 * 4 and {r["task_id"] for r in rows} == set(cols["task_id"])
    assert all(r["source"] == "env" and r["verdict"] in ("pass", "fail", "hack", "model_error", "timeout")
               for r in rows), rows
    assert sum(logged) / len(logged) == pytest.approx(sum(r["reward"] for r in rows) / len(rows))


@pytest.fixture(scope="module")
def guess_env(tmp_path_factory):
    """tests/tasks/openenv_guess_env.py served by openenv-core's own server code on loopback; yields its URL."""
    d = tmp_path_factory.mktemp("guess")
    port = free_port()
    with in_background([sys.executable, str(HERE / "openenv_guess_env.py"), str(port)], d / "guess.log") as proc:
        url = f"http://127.0.0.1:{port}"
        wait_until_answers(f"{url}/health", proc, d / "guess.log")
        yield url


def test_generate_on_an_openenv_environment_records_its_reward_as_the_verdicts_source(guess_env, tmp_path):
    from tasks.openenv import STEP_TOOL
    from tasks.suites import load_suite
    from tests.agents.fault_server import FaultServer
    from tests.tasks.openenv_guess_env import target_of

    suite = f"openenv:{guess_env}"
    found = load_suite(suite, 4)
    assert [t.metadata["seed"] for t in found] == [0, 1, 2, 3]
    assert found[0].tool_specs[0]["function"]["parameters"]["properties"] == {"guess": {"title": "Guess",
                                                                                        "type": "integer"}}
    # the scripted teacher guesses right on tasks 0 and 1, one too high on 2 and 3
    solutions = {t.prompt: {"tool": STEP_TOOL, "arguments": {"guess": target_of(i) + (i >= 2)}}
                 for i, t in enumerate(found)}
    with FaultServer(solutions=solutions, tool_turns=1) as srv:
        done = subprocess.run([FLYWHEEL, "generate", "--suite", suite, "--n-tasks", "4", "--samples", "1",
                               "--teacher", "openai", "--base-url", srv.base_url, "--model", "ok", "--backend", "local",
                               "--out", str(tmp_path / "lake")], capture_output=True, text=True, check=False, timeout=600,
                              cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(str(tmp_path / "lake"))
    assert [(r["verdict"], r["reward"]) for r in rows] == [("pass", 1.0), ("pass", 1.0), ("fail", 0.0), ("fail", 0.0)]
    assert {(r["verifier"], r["verifier_strength"], r["suite"]) for r in rows} == {("openenv", "env", "openenv-GuessEnvironment")}
    details = [json.loads(r["verifier_details_json"]) for r in rows]
    assert [d["env_done"] for d in details] == [True, True, False, False]
    assert all(d["env_prompt_matches"] for d in details)


def test_a_suite_at_a_url_nobody_serves_is_one_error_line(tmp_path):
    done = subprocess.run([FLYWHEEL, "generate", "--suite", f"openenv:http://127.0.0.1:{free_port()}", "--n-tasks",
                           "1", "--backend", "local", "--out", str(tmp_path / "lake")], capture_output=True, text=True, check=False,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: cannot read http://127.0.0.1:"), done.stderr
    assert not (tmp_path / "lake").exists()


def test_rows_with_engine_tokens_export_as_rfc012_records_and_import_back(served, tasks, tmp_path):
    """A client that sends its engine's token ids and logprobs with each turn: the row keeps them, `flywheel export
    --format openenv` writes RFC 012 records (a row without them is refused by name, nothing written), and
    `flywheel demos import --format openenv` brings the records back as judged rows with the same tokens."""
    from tasks.openenv import EpisodeClient

    url, lake = served
    task = tasks[4]
    step = task.reference.steps[0]
    turns = [({"tool_calls": [{"name": step.tool, "arguments": step.arguments}]}, [5, 6, 7], [-0.5, -0.25, -1.0]),
             ({"content": task.reference.final}, [8, 9], [-0.125, -2.0])]
    client = EpisodeClient(url)
    try:
        client.reset(seed=4, policy="test-tokens")
        for k, (action, ids, lps) in enumerate(turns):
            obs, _, done = client.step({**action, "prompt_token_ids": list(range(10 + k)),
                                             "completion_token_ids": ids, "logprobs": lps})
        client.reset(seed=5, policy="test-no-tokens")
        client.step({"content": "Answer: 1"})  # a row without tokens
    finally:
        client.close()
    assert done and obs["verdict"] == "pass"
    out = tmp_path / "rollouts.jsonl"
    cmd = [FLYWHEEL, "export", str(out), "--root", lake, "--format", "openenv"]
    refused = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=300)  # every row, one without tokens
    assert refused.returncode == 2 and "cannot be OpenEnv training records" in refused.stderr, refused.stderr
    assert "no engine token ids and logprobs" in refused.stderr and not out.exists()
    done_ = subprocess.run([*cmd, "--where", "policy = 'openenv:test-tokens'"], capture_output=True, text=True, check=False,
                           timeout=300)
    assert done_.returncode == 0, done_.stderr
    [rec] = [json.loads(line) for line in out.read_text().splitlines()]
    assert (rec["schema_version"], rec["task_id"], rec["purpose"], rec["reward"]) == (1, task.id, "train", 1.0)
    assert [t["completion_token_ids"] for t in rec["turns"]] == [[5, 6, 7], [8, 9]]
    assert [t["per_token_logps"] for t in rec["turns"]] == [[-0.5, -0.25, -1.0], [-0.125, -2.0]]
    assert rec["turns"][1]["loss_mask"] == [0] * 11 + [1, 1] and rec["n_trainable_tokens"] == 5
    assert rec["trace_entries"][1]["request"]["messages"][-1]["role"] == "tool"
    assert rec["metadata"]["flywheel"]["verdict"] == "pass"
    back = tmp_path / "lake2"
    imp = subprocess.run([FLYWHEEL, "demos", "import", str(out), "--root", str(back), "--format", "openenv"],
                         capture_output=True, text=True, check=False, timeout=300)
    assert imp.returncode == 0, imp.stderr
    [row] = _rows(str(back))
    [orig] = _rows(lake, "policy = 'openenv:test-tokens'")
    assert (row["source"], row["policy"], row["verdict"], row["verifier_strength"]) == (
        "env", "openenv:test-tokens", "pass", "env")
    for k in ("completion_token_ids", "completion_logprobs", "prompt_token_ids", "n_messages", "task_id", "suite"):
        assert row[k] == orig[k], k


def test_a_code_task_served_in_process_is_judged_by_its_hidden_tests(tmp_path):
    """Another suite through the same bridge (openenv's Environment in process, no HTTP): the code suite's workspace
    files, its write/run tools in the sandbox and its unit-test verifier, as in a rollout."""
    from agents.env_server import SuiteServer
    from sandbox.backend import open_backend
    from sandbox.result import SandboxConfig
    from tasks.openenv import suite_environment, wire_types
    from tasks.suites import load_suite

    action_cls, _ = wire_types()
    [task] = load_suite("code", 1)
    with open_backend(SandboxConfig(backend="local"), pool_size=1) as be:
        server = SuiteServer(tasks=[task], backend=be, root=str(tmp_path / "lake"), run_id="env-code")
        env = suite_environment(server.session)()
        first = env.reset(seed=0, policy="ref")
        assert [t["function"]["name"] for t in first.tools] == list(task.tools)
        for step in task.reference.steps:
            obs = env.step(action_cls(tool_calls=[{"name": step.tool, "arguments": step.arguments}]))
            assert not obs.done and obs.messages[-1]["role"] == "tool"
        last = env.step(action_cls(content=task.reference.final))
        env.close()
    assert (last.done, last.verdict, last.reward) == (True, "pass", 1.0), last
    assert last.verifier_strength not in (None, "env") and server.written == 1
