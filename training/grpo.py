"""GRPO on tasks with TRL's GRPOTrainer: our sandboxes as the environment, our verifiers and forensics as the reward.

Each training row is one task: its opening messages exactly as the episode loop sends them (agents.loop.
initial_messages) and the task as JSON. The trainer samples `num_generations` episodes per task (multi-turn: tool
calls run in sandboxes through training.environment, results appended, generation resumed, up to
`max_tool_calling_iterations` calls within `max_completion_length` tokens; TRL reads each generation with the one conversation codec,
training.environment.use_codec_parser), scores each with
training.environment.EpisodeReward (hack -> 0; infrastructure failure -> left out, never 0) and updates the policy.
Diagnostics (training.diagnostics) are collected every step, with the update check (what each step's update did to
the probability of its own rewarded and unrewarded completions) unless `update_check=False`.

CPU path: plain `generate` (use_vllm=False). GPU path: vLLM colocated or as a server, behind the `gpu` extra;
asking for it without vLLM installed or without a CUDA device raises TrainingError naming the fix.
With an `EpisodeLog`, every generation the reward scores becomes a lake row as the batch is scored (the trainer
hook sees TRL's advantages for the batch; training.environment.grpo_rows builds the rows with the episode loop's
row builder): source student, stage grpo, step, group, advantage, reward, verdict, hack flags.
This module does not choose tasks or register checkpoints.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sandbox.result import Backend
from tasks.spec import Task
from training.attention import use_attention
from training.config import DiagnosticsThresholds, GRPOConfig
from training.sft import TrainingError, router_logits_off
from warehouse import chat


class GRPOResult(BaseModel):
    checkpoint_path: str
    losses: list[float] = Field(description="Policy loss at each logged step.")
    rewards: list[float] = Field(description="Mean reward of each step's rollouts (before that step's update).")
    steps: int
    wall_s: float = Field(description="Seconds in trainer.train() (rollouts, tools, verification, updates).")
    total_s: float
    episodes: int = Field(description="Episodes scored.")
    verdicts: dict[str, int] = Field(description="Verdict counts over all rollouts (pass, fail, hack, model_error, "
                                                 "infra).")
    hacks_with_positive_reward: int = Field(description="Hacked episodes that received reward > 0 (must be 0).")
    rows_written: int = Field(default=0, description="Episode rows written to the lake (stage grpo); 0 without "
                                                     "an episode log.")
    rows_skipped: int = Field(default=0, description="Episode rows already in the lake (a re-run's same ids).")
    task_containers: dict[str, int] = Field(default_factory=dict, description="Harbor tasks' agent containers "
                                            "with grpo.harbor_reuse: started, reused (generations that got a reset "
                                            "one) and reset_failed (removed instead); empty without Harbor tasks.")
    diagnostics: dict[str, Any] = Field(default_factory=dict, description="Per-run summary of step diagnostics.")
    steps_diagnostics: list[dict[str, Any]] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    stopped: str | None = Field(default=None, description="Why training stopped early (a gradient norm above "
                                "diagnostics.stop_grad_norm); None when it ran all its steps.")


def check_gpu_path(cfg: GRPOConfig) -> None:
    """Raise TrainingError naming the fix when cfg asks for vLLM and this machine cannot give it."""
    if not cfg.use_vllm:
        return
    import importlib.util

    import torch

    if importlib.util.find_spec("vllm") is None:
        raise TrainingError("GRPOConfig.use_vllm=True needs vLLM: pip install 'flywheel[gpu]' (a torch/vllm pin set "
                            "that agree; see README), or set use_vllm=False for plain generation")
    if cfg.vllm_mode == "colocate" and not torch.cuda.is_available():
        raise TrainingError("vLLM colocate mode needs a CUDA GPU; set use_vllm=False on CPU")
    if cfg.vllm_mode == "server" and not cfg.vllm_server_base_url:
        raise TrainingError("vllm_mode='server' needs vllm_server_base_url (the URL of `trl vllm-serve`)")


def _trainer_class() -> type:
    """TRL's GRPOTrainer, plus a hook that shows every training batch to the update check before its update."""
    from trl import GRPOTrainer

    class FlywheelGRPOTrainer(GRPOTrainer):
        update_check: Any = None
        episode_log: EpisodeLog | None = None
        reward_fn: Any = None

        def _generate_and_score_completions(self, inputs: Any) -> Any:
            out = super()._generate_and_score_completions(inputs)
            if self.episode_log is not None and self.model.training:
                self.episode_log.log(self.reward_fn.last_episodes, out["advantages"].tolist(),
                                     step=int(self.state.global_step), num_generations=self.num_generations)
            return out

        def _prepare_inputs(self, generation_batch: Any) -> Any:
            batch = super()._prepare_inputs(generation_batch)
            if self.update_check is not None and self.model.training:
                self.update_check.before(self.model, batch)
            return batch

        def _tool_call_loop(self, prompts: list, prompt_ids: list, completion_ids: list, completions: list,
                            logprobs: Any, images: Any, multimodal_fields: Any) -> tuple:
            """TRL's tool loop, then the later user turns of multi-turn tasks (BFCL's) as the episode loop plays
            them: when a rollout's reply ended (its end token) without a call and its task has a user turn left, that
            turn is appended (its tokens out of the loss, as tool results are), the model replies, and TRL's loop
            runs that reply's calls; everything within max_completion_length tokens of completion. A rollout out
            of budget ends there, its later turns unanswered (the task's checker sees them so)."""
            from trl.trainer.grpo_trainer import parse_response

            loop = super()._tool_call_loop
            tool_mask, completions, completion_ids, logprobs, n_calls, n_failed, tool_images = loop(
                prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields)
            envs = self.environments or []
            ends = {*self.eos_token_ids, self._tokenizer.pad_token_id}
            while True:
                pending = []
                for i, env in enumerate(envs):
                    last = completions[i][-1] if completions[i] else {}
                    if not getattr(env, "later", None) or last.get("tool_calls") or not completion_ids[i] \
                            or completion_ids[i][-1] not in ends:
                        continue
                    user = {"role": "user", "content": env.later.pop(0)}
                    suffix = self._user_suffix_ids(user)
                    if len(completion_ids[i]) + len(suffix) >= self.max_completion_length:
                        env.later.clear()
                        continue
                    completions[i].append(user)
                    completion_ids[i] = completion_ids[i] + suffix
                    tool_mask[i] = tool_mask[i] + [0] * len(suffix)
                    if logprobs is not None:
                        logprobs[i] = logprobs[i] + [0.0] * len(suffix)
                    pending.append(i)
                if not pending:
                    break
                new_ids, new_logprobs = self._generate_single_turn(
                    [prompt_ids[i] + completion_ids[i] for i in pending], None, {}, num_generations=1)
                replies: list[dict] = [{} for _ in envs]
                for k, i in enumerate(pending):
                    room = self.max_completion_length - len(completion_ids[i])
                    ids = list(new_ids[k][:room])
                    prefix = prompt_ids[i] + completion_ids[i]
                    completion_ids[i] = completion_ids[i] + ids
                    tool_mask[i] = tool_mask[i] + [1] * len(ids)
                    if logprobs is not None:
                        logprobs[i] = logprobs[i] + list(new_logprobs[k][:room])
                    if ids:
                        replies[i] = parse_response(self._tokenizer, ids, prefix=prefix, tools=None)
                        completions[i].append(replies[i])
                if not any(r.get("tool_calls") for r in replies):
                    continue
                before = [len(m) for m in tool_mask]
                views = [[r] for r in replies]  # TRL's loop reads each rollout's calls from its first message
                mask, views, completion_ids, logprobs, calls, failed, _ = loop(
                    [list(p) for p in prompts], prompt_ids, completion_ids, views, logprobs, images,
                    multimodal_fields)
                for i in range(len(envs)):
                    tool_mask[i] = tool_mask[i] + mask[i][before[i]:]
                    completions[i] += views[i][1:]
                n_calls, n_failed = n_calls + calls, n_failed + failed
            return tool_mask, completions, completion_ids, logprobs, n_calls, n_failed, tool_images

        def _user_suffix_ids(self, user: dict[str, Any]) -> list[int]:
            """Token ids of a user message after an assistant turn's end token, with the generation prompt: the
            template's rendering of [user, assistant, user] minus that of [user, assistant] cut at its last end
            token (how TRL renders tool results between turns, _get_tool_suffix_ids)."""
            head = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]
            kw = {"tokenize": True, "chat_template": self.chat_template, "return_dict": False,
                  **self.chat_template_kwargs}
            prefix = list(self.processing_class.apply_chat_template(head, add_generation_prompt=False, **kw))
            full = list(self.processing_class.apply_chat_template(head + [user], add_generation_prompt=True, **kw))
            eos = set(self.eos_token_ids)
            ends = [k for k, t in enumerate(prefix) if t in eos]
            if ends:
                prefix = prefix[: ends[-1] + 1]
            if full[: len(prefix)] != prefix:
                raise TrainingError("the chat template does not render a later user turn as a continuation of the "
                                    "conversation before it (not prefix-preserving); GRPO cannot play multi-turn "
                                    "tasks with it")
            return full[len(prefix):]

        def completion_logps(self, model: Any, batch: dict[str, Any]) -> Any:
            """Log-probability of each completion, summed over its trained tokens (tool results excluded)."""
            import torch

            ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
            mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
            keep = batch["completion_ids"].size(1)
            with torch.no_grad():
                logps, _, _ = self._get_per_token_logps_and_entropies(model, ids, mask, keep)
            trained = batch["completion_mask"] * batch.get("tool_mask", 1)
            return (logps * trained).sum(-1).detach()

    return FlywheelGRPOTrainer


@dataclass
class EpisodeLog:
    """Where GRPO's episodes go: every scored generation becomes a lake row (training.environment.grpo_rows)
    written through warehouse.lake.write_trajectories under (run_id, round), policy name `policy`."""

    root: str
    run_id: str
    round: int
    policy: str
    model_version: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    written: int = 0
    skipped: int = 0

    def log(self, episodes: list[Any], advantages: list[float], *, step: int, num_generations: int) -> None:
        from training.environment import grpo_rows
        from warehouse.lake import write_trajectories

        rows = grpo_rows(episodes, advantages, step=step, num_generations=num_generations, run_id=self.run_id,
                         round=self.round, policy=self.policy, sampling=self.sampling,
                         model_version=self.model_version)
        res = write_trajectories(self.root, rows)
        self.written += res.written
        self.skipped += res.skipped


def _sampling(cfg: GRPOConfig) -> dict[str, Any]:
    """The sampling parameters of GRPO's generations, as its rows record them."""
    return {"temperature": cfg.temperature, "top_p": cfg.top_p, "max_completion_length": cfg.max_completion_length,
            "max_tool_calling_iterations": cfg.max_tool_calling_iterations, "num_generations": cfg.num_generations,
            "seed": cfg.seed}


def task_rows(tasks: list[Task]) -> dict[str, list]:
    """Dataset columns for GRPO: prompt (system + user, as the loop opens), task_json, environment (tool set)."""
    from agents.loop import initial_messages

    if not tasks:
        raise TrainingError("train_grpo got no tasks; pass the suite's train split")
    prompts, jsons, envs = [], [], []
    for t in tasks:
        prompts.append(chat.to_template(initial_messages(t)))
        jsons.append(t.model_dump_json())
        envs.append(",".join(t.tools))
    return {"prompt": prompts, "task_json": jsons, "environment": envs}


def train_grpo(model_path: str | Path, tasks: list[Task], out_dir: str | Path, cfg: GRPOConfig, *,
               backend: Backend, rewards: Any = None, thresholds: DiagnosticsThresholds | None = None,
               progress: bool = True, episode_log: EpisodeLog | None = None, attention: str = "eager") -> GRPOResult:
    """Improve `model_path` with GRPO on `tasks` (train split), tool calls in sandboxes of `backend`.

    Saves the new student to `out_dir`. `rewards` is an optional tasks.judge.rewards.RewardConfig (process terms).
    With `episode_log`, every generation GRPO scores is written to the lake as it is scored (stage grpo).
    `attention` is the attention kernel the policy trains and generates with (training/attention.py).
    Seeded: the same inputs and config give the same loss sequence on the same machine (CPU path).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import GRPOConfig as TRLGRPOConfig

    from training.diagnostics import DiagnosticsCallback, UpdateCheck
    from training.environment import EpisodeReward, environment_class, show_task_schemas, use_codec_parser

    t0 = time.perf_counter()
    check_gpu_path(cfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    set_seed(cfg.seed)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    cols = task_rows(tasks)
    tool_sets = sorted(set(cols["environment"]))
    specs = {",".join(t.tools): t.tool_specs for t in tasks}  # a tool set's own tools' schemas (BFCL's)
    factories = {ts: environment_class(ts.split(","), backend, specs=specs[ts], tool_timeout_s=cfg.sandbox_timeout_s,
                                       reuse_task_containers=cfg.harbor_reuse)
                 for ts in tool_sets}
    if len(factories) == 1:
        factory: Any = next(iter(factories.values()))
        del cols["environment"]
    else:
        factory = factories
    dataset = Dataset.from_dict(cols)
    tokenizer = use_codec_parser(AutoTokenizer.from_pretrained(str(model_path)))
    tokenizer.padding_side = "left"
    model = use_attention(AutoModelForCausalLM.from_pretrained(str(model_path)), attention)
    router_logits_off(model)  # MoE students: generation must not compute the aux loss (training/sft.py)
    reward_fn = EpisodeReward(backend=backend, rewards=rewards, strengths=tuple(cfg.reward_strengths))
    check = UpdateCheck() if cfg.update_check else None
    diag = DiagnosticsCallback(thresholds, update_check=check, stop=True)
    cuda = torch.cuda.is_available()
    batch = cfg.num_generations * cfg.prompts_per_step
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vllm_kw: dict[str, Any] = {}
    if cfg.use_vllm:
        vllm_kw = {"use_vllm": True, "vllm_mode": cfg.vllm_mode,
                   "vllm_gpu_memory_utilization": cfg.vllm_gpu_memory_utilization}
        if cfg.vllm_server_base_url:
            vllm_kw["vllm_server_base_url"] = cfg.vllm_server_base_url
    with tempfile.TemporaryDirectory(prefix="flywheel-grpo-") as scratch:
        args = TRLGRPOConfig(
            output_dir=scratch, max_steps=cfg.max_steps, per_device_train_batch_size=batch,
            gradient_accumulation_steps=1, num_generations=cfg.num_generations, learning_rate=cfg.learning_rate,
            warmup_steps=cfg.warmup_ratio,  # a float below 1 is a share of max_steps (transformers 5)
            beta=cfg.beta, loss_type=cfg.loss_type, epsilon=cfg.epsilon, num_iterations=cfg.num_iterations,
            temperature=cfg.temperature, top_p=cfg.top_p, max_completion_length=cfg.max_completion_length,
            max_tool_calling_iterations=cfg.max_tool_calling_iterations, scale_rewards=cfg.scale_rewards,
            seed=cfg.seed, data_seed=cfg.seed, logging_steps=cfg.logging_steps, save_strategy="no",
            report_to="none", disable_tqdm=not progress, dataloader_num_workers=0, use_cpu=not cuda,
            bf16=bool(cfg.bf16 and cuda), log_completions=False, **vllm_kw,
        )
        trainer = _trainer_class()(model=model, reward_funcs=[reward_fn], args=args, train_dataset=dataset,
                                   processing_class=tokenizer, environment_factory=factory,
                                   callbacks=[diag] if check is None else [check, diag])
        show_task_schemas(trainer)  # the prompt shows the tools as the loop and SFT do
        if check is not None:
            check.score = trainer.completion_logps
            trainer.update_check = check
        if episode_log is not None:
            if not episode_log.sampling:
                episode_log.sampling = _sampling(cfg)
            trainer.episode_log, trainer.reward_fn = episode_log, reward_fn
        t1 = time.perf_counter()
        try:
            trainer.train()
        finally:
            for env_list in getattr(trainer, "_environment_pool", {}).values():
                for env in env_list:
                    env._close()
            task_containers: dict[str, int] = {}
            if any(t.verifier.kind == "harbor" for t in tasks):
                from tasks import harbor

                task_containers = harbor.reuse_stats() if cfg.harbor_reuse else {}
                harbor.shutdown()  # the containers waiting for a next generation, and the graders' backends
        wall = time.perf_counter() - t1
        hist = trainer.state.log_history
        losses = [float(h["loss"]) for h in hist if "loss" in h]
        # a step whose every generation was left out of the reward (infra, untrusted strength) logs None
        step_rewards = [float(h["reward"]) for h in hist if h.get("reward") is not None]
        trainer.save_model(str(out))
        tokenizer.padding_side = "right"
        tokenizer.save_pretrained(str(out))
    s = reward_fn.stats
    return GRPOResult(
        checkpoint_path=str(out), losses=losses, rewards=step_rewards, steps=int(trainer.state.global_step),
        task_containers=task_containers,
        wall_s=wall, total_s=time.perf_counter() - t0, episodes=s["episodes"],
        verdicts={k: s[k] for k in ("pass", "fail", "hack", "model_error", "infra")},
        hacks_with_positive_reward=sum(1 for h in reward_fn.history if h["verdict"] == "hack" and h["reward"] > 0),
        diagnostics=diag.summary(), steps_diagnostics=[d.model_dump() for d in diag.steps],
        warnings=list(diag.warnings), stopped=diag.stopped, rows_written=episode_log.written if episode_log else 0,
        rows_skipped=episode_log.skipped if episode_log else 0,
    )
