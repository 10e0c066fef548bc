"""The in-process student policy: a transformers causal LM answering conversations, tool calls parsed from its text.

`TransformersPolicy` implements agents.policy.Policy for a local model folder or hub id (the tiny student, an SFT or
GRPO checkpoint). Concurrent `reply` calls (the rollout runner's workers) are gathered into one left-padded
`generate` call of up to `batch_size` conversations, run in a worker thread so the event loop stays free. Prompts
are rendered with `warehouse.chat.to_template` and the reply text (`completion_text`: decoded up to the stop token)
is read with `warehouse.chat.parse_text` in the dialect of the model's chat template (`warehouse.chat.dialect_of`:
Hermes `<tool_call>` blocks with Qwen3 `<think>`, or GPT-OSS harmony channels), the one conversation codec that SFT,
GRPO and export use too; generation stops at any of the model's end-of-turn tokens (generation_config.eos_token_id:
harmony's `<|call|>` and `<|return|>`, or `<|im_end|>`). A malformed `<tool_call>` block or an empty reply stays in
the message for the loop to judge (model_error). `max_new_tokens` is a ceiling per reply: a later turn whose prompt
leaves less room in the model's context (max_position_embeddings) is generated up to that room (a reply cut there
finishes with "length", as one cut by the ceiling does), so that a multi-turn episode whose first call was long can
still give its final answer; only a prompt that fills the context raises ContextLengthError. Each reply carries what
the model actually saw and wrote: the prompt's token ids as fed to `generate`, the completion's ids (up to and
including the stop token) and their logprobs, the chat template's hash (`warehouse.chat.template_hash`) and the
checkpoint's version (`checkpoint_version`: a content hash of its files), read by `TurnReader`, which the vLLM
policy shares. Reasoning is rendered the way the template expects (`warehouse.chat.to_template`: harmony's analysis
channel, a field such as Qwen3's `reasoning_content`, or inline as `<think>` in the content) and read back by the
codec. Greedy decoding (temperature 0) is deterministic; sampling is seeded per request, by (seed, task id, sample
index, turn): each row draws its own Gumbel noise (argmax of logits/T + Gumbel noise is an exact sample of
softmax(logits/T)), so a sampled reply does not depend on which requests share its batch or on thread timing, and a
resumed run samples what the uninterrupted one did. Which requests share a batch still moves a row's logits in the
last bits (padding to the batch's longest prompt: measured up to 5e-7 in a logprob), which can flip a near-tie
token. So the rollout runner holds the policy in lockstep (`lockstep`, agents/rollout.py): a batch is cut only when
every worker of the rollout that still has episodes waits for a reply, and its requests are ordered by their keys,
so each batch is the same set in the same order whatever the load and the thread timing (`LOCKSTEP_WAIT_S` bounds
the wait: past it the batch is cut with a warning, as a worker blocked elsewhere must not stall the others). This
module does not run tools or verify anything."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from pathlib import Path
from typing import Any

from agents.policy import ContextLengthError, PolicyReply
from tasks.spec import Task
from warehouse import chat
from warehouse.record import Message, Source

END_OF_TURN = ("<|im_end|>", "<|return|>", "<|call|>")  # Qwen/Hermes; harmony's answer and tool-call ends
LOCKSTEP_WAIT_S = 120.0  # the longest a lockstep batch waits for the rollout's other workers
log = logging.getLogger(__name__)


def stop_token_ids(tokenizer: Any, extra: Any = None) -> list[int]:
    """The ids that end a turn: EOS, every END_OF_TURN token the vocabulary has, and `extra` (a model's
    generation_config.eos_token_id: an id or a list). The policy stops generation at them; the drift preflight
    (training/preflight.py) ends a generated span at them."""
    extra = extra if isinstance(extra, list) else [extra]
    vocab = tokenizer.get_vocab()
    return sorted({i for i in [tokenizer.eos_token_id, *extra, *(vocab.get(t) for t in END_OF_TURN)]
                   if isinstance(i, int) and i >= 0})


def completion_text(tokenizer: Any, ids: list[int]) -> str:
    """Generated token ids -> the reply text: decoded with special tokens, cut at the first end of turn
    (`<|im_end|>`, harmony's `<|return|>` / `<|call|>`, or EOS), padding removed. GRPO reads its generations
    through this too."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    for tok in (*END_OF_TURN, tokenizer.eos_token or ""):
        if tok:
            text = text.split(tok, 1)[0]
    return text.replace(tokenizer.pad_token or "\0", "")


CONTENT_HASH_MAX_BYTES = 512 * 2**20  # above this, checkpoint_version hashes file names, sizes and mtimes


def checkpoint_version(model_path: str | Path) -> str:
    """A model's version for the record: for a local folder, `sha256:` + 16 hex of its config, tokenizer and weight
    files' contents (`stat:` + 16 hex of their names, sizes and mtimes when the weights exceed
    CONTENT_HASH_MAX_BYTES, where reading them all would cost seconds); for a hub id, `hub:` + the id."""
    root = Path(model_path)
    if not root.is_dir():
        return f"hub:{model_path}"
    files = sorted(p for p in root.iterdir() if p.is_file() and (p.suffix in (".safetensors", ".bin", ".json", ".jinja")
                                                                 or p.name == "tokenizer.model"))
    by_content = sum(p.stat().st_size for p in files) <= CONTENT_HASH_MAX_BYTES
    h = hashlib.sha256()
    for p in files:
        h.update(p.name.encode() + b"\0")
        if by_content:
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
        else:
            st = p.stat()
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return f"{'sha256' if by_content else 'stat'}:{h.hexdigest()[:16]}"


class TurnReader:
    """Reads a generated turn the way every in-process policy records it (this one and agents/vllm_policy.py):
    the completion's ids decoded with special tokens up to the stop token (`completion_text`), parsed by the one
    codec in the dialect of the tokenizer's chat template (harmony for GPT-OSS, else Hermes), with the template's
    hash and the model's version (`checkpoint_version`) on the reply."""

    def __init__(self, tokenizer: Any, model_path: str | Path) -> None:
        self.tokenizer = tokenizer
        self.dialect = chat.dialect_of(tokenizer.chat_template)
        self.chat_template_hash = chat.template_hash(tokenizer.chat_template)
        self.model_version = checkpoint_version(model_path)

    def reply(self, ids: list[int], *, turn: int, prompt_ids: list[int], logprobs: list[float] | None,
              finish: str | None) -> PolicyReply:
        message = chat.parse_text(completion_text(self.tokenizer, ids), turn=turn, dialect=self.dialect)
        return PolicyReply(message=message, prompt_tokens=len(prompt_ids), completion_tokens=len(ids),
                           finish_reason="tool_calls" if message.tool_calls else finish, token_ids=ids,
                           logprobs=logprobs, prompt_token_ids=prompt_ids or None,
                           chat_template_hash=self.chat_template_hash, model_version=self.model_version)


def sample_key(*parts: Any) -> int:
    """A 63-bit seed from the parts that identify one sampled reply (seed, task id, sample index, turn)."""
    return int.from_bytes(hashlib.sha256(json.dumps(parts).encode()).digest()[:8], "big") >> 1


class _RowGumbel:
    """A logits processor for greedy search that makes it sampling: temperature, then top-p, then Gumbel noise from
    one generator per row (the row's own key), so each row's sample is independent of its batch."""

    def __init__(self, keys: list[int], temperature: float, top_p: float) -> None:
        import torch

        self.gens = [torch.Generator().manual_seed(k) for k in keys]
        self.temperature = temperature
        self.top_p = top_p

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        scores = scores.float() / self.temperature
        if self.top_p < 1.0:
            probs, order = torch.sort(scores.softmax(-1), dim=-1, descending=True)
            drop = probs.cumsum(-1) - probs > self.top_p  # keep the smallest prefix whose mass reaches top_p
            scores = scores.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), float("-inf"))
        u = torch.stack([torch.rand(scores.shape[-1], generator=g) for g in self.gens]).to(scores.device)
        return scores - torch.log(-torch.log(u.clamp_min(1e-20)))


class _Request:
    __slots__ = ("budget", "future", "key", "loop", "prompt_ids")

    def __init__(self, prompt_ids: list[int], future: asyncio.Future, loop: asyncio.AbstractEventLoop,
                 key: int, budget: int) -> None:
        self.prompt_ids = prompt_ids
        self.future = future
        self.loop = loop
        self.key = key
        self.budget = budget


class TransformersPolicy:
    """A local causal LM as a Policy (see the module docstring)."""

    def __init__(self, model_path: str | Path, *, name: str | None = None, temperature: float = 0.0,
                 top_p: float = 1.0, max_new_tokens: int = 128, device: str = "auto", seed: int = 0,
                 batch_size: int = 32, source: Source = "student", dtype: str = "auto",
                 threads: int | None = None, enable_thinking: bool | None = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)  # process-wide; 1 is fastest for tiny models on a shared CPU
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError("batch_size and max_new_tokens must be >= 1")
        self.model_path = str(model_path)
        self.name = name or Path(self.model_path).name
        self.source: Source = source
        self.endpoint: str | None = None
        self.temperature = temperature
        self.top_p = top_p
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.batch_size = batch_size
        # a template switch (Qwen3: False prefills an empty <think></think>, the reply is the answer); None: default
        self.template_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        torch_dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        self.model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch_dtype).to(device).eval()
        text_config = self.model.config.get_text_config()
        if getattr(text_config, "output_router_logits", False):  # a MoE checkpoint saved mid-training: generation
            text_config.output_router_logits = False  # with a KV cache cannot compute the aux loss (GPT-OSS)
        self.max_context = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or None
        self._queue: list[_Request] = []
        self._slots = 0  # rollout workers held in lockstep (see the module docstring)
        self._wake: asyncio.Event | None = None
        self._lock = threading.Lock()
        self._worker: asyncio.Task | None = None
        self._batches = 0
        self.reader = TurnReader(self.tokenizer, self.model_path)
        self.dialect, self.chat_template_hash = self.reader.dialect, self.reader.chat_template_hash
        self.model_version = self.reader.model_version
        self._stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config.eos_token_id)

    @property
    def sampling(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "max_new_tokens": self.max_new_tokens,
                "seed": self.seed, "batch_size": self.batch_size, "model_path": self.model_path,
                **self.template_kwargs}

    def prompt_ids(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        """Token ids of the conversation rendered for generation (the assistant header at the end)."""
        enc = self.tokenizer.apply_chat_template(chat.to_template(messages, template=self.tokenizer.chat_template),
                                                 tools=tools or None, tokenize=True,
                                                 add_generation_prompt=True, return_dict=True,
                                                 **self.template_kwargs)
        return list(enc["input_ids"])

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply:
        ids = self.prompt_ids(messages, tools)
        budget = self.budget(len(ids))
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        self._queue.append(_Request(ids, fut, loop, sample_key(self.seed, task.id, sample_index, len(messages)),
                                    budget))
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        elif self._wake is not None:
            self._wake.set()
        out_ids, logprobs, finish = await fut
        return self.reader.reply(out_ids, turn=len(messages), prompt_ids=ids, logprobs=logprobs, finish=finish)

    def budget(self, prompt_tokens: int) -> int:
        """New tokens a reply to a prompt of `prompt_tokens` may have: max_new_tokens, or the room left in the
        model's context when that is less. ContextLengthError when the prompt leaves no room at all."""
        if not self.max_context:
            return self.max_new_tokens
        room = self.max_context - prompt_tokens
        if room < 1:
            raise ContextLengthError(f"prompt of {prompt_tokens} tokens fills the context of {self.max_context} "
                                     f"tokens of {self.model_path}: no room for a reply")
        return min(self.max_new_tokens, room)

    def lockstep(self, workers: int) -> None:
        """Hold `workers` more rollout workers in lockstep (called by agents.rollout in its event loop): batches wait
        until every held worker waits for a reply. Each worker calls `lockstep_done` when it has no more episodes."""
        self._slots += workers
        self._wake = self._wake or asyncio.Event()

    def lockstep_done(self) -> None:
        """One held worker has no more episodes: batches no longer wait for it."""
        self._slots = max(0, self._slots - 1)
        if self._wake is not None:
            self._wake.set()
        if self._slots == 0:
            self._wake = None

    async def _gathered(self) -> None:
        """Wait until every lockstep worker has a request queued (at most LOCKSTEP_WAIT_S)."""
        deadline = asyncio.get_running_loop().time() + LOCKSTEP_WAIT_S
        while self._slots and len(self._queue) < self._slots and self._wake is not None:
            self._wake.clear()
            left = deadline - asyncio.get_running_loop().time()
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.0, left))
            except TimeoutError:
                log.warning("%s: lockstep batch cut after %.0f s with %d of %d workers waiting (a worker is blocked "
                            "elsewhere); this batch's composition depends on timing", self.name, LOCKSTEP_WAIT_S,
                            len(self._queue), self._slots)
                return
        if self._slots:
            self._queue.sort(key=lambda r: r.key)

    async def _drain(self) -> None:
        # Let every worker that is about to ask do so before the batch is cut.
        await asyncio.sleep(0)
        while self._queue:
            await self._gathered()
            batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size:]
            try:
                results = await asyncio.to_thread(self._generate, [r.prompt_ids for r in batch],
                                                  [r.key for r in batch], [r.budget for r in batch])
            except Exception as e:  # the whole batch failed: every waiter sees it  # noqa: BLE001
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(e)
                continue
            for r, res in zip(batch, results):
                if not r.future.done():
                    r.future.set_result(res)
            await asyncio.sleep(0)

    def generate_batch(self, prompts: list[list[int]], keys: list[int] | None = None
                       ) -> list[tuple[list[int], list[float], str]]:
        """Generate for several prompts at once: (completion ids up to the stop token, their logprobs, finish).
        When sampling, `keys` seed each row (default: the policy's seed and the row's position). Each row's
        length is bounded by `budget` (ContextLengthError for a prompt that fills the context)."""
        return self._generate(prompts, keys if keys is not None else
                              [sample_key(self.seed, i) for i in range(len(prompts))],
                              [self.budget(len(p)) for p in prompts])

    def _generate(self, prompts: list[list[int]], keys: list[int], budgets: list[int]
                  ) -> list[tuple[list[int], list[float], str]]:
        """One `generate` call per distinct budget in the batch (almost always one), so that no row is generated
        past its room in the context; results in the order of `prompts`."""
        with self._lock:
            self._batches += 1
            results: list[tuple[list[int], list[float], str]] = [([], [], "length")] * len(prompts)
            for budget in sorted(set(budgets), reverse=True):
                rows = [i for i, b in enumerate(budgets) if b == budget]
                for i, res in zip(rows, self._generate_rows([prompts[i] for i in rows], [keys[i] for i in rows],
                                                            budget)):
                    results[i] = res
            return results

    def _generate_rows(self, prompts: list[list[int]], keys: list[int], budget: int
                       ) -> list[tuple[list[int], list[float], str]]:
        import torch
        from transformers import LogitsProcessorList

        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p):] = 1
        kw: dict[str, Any] = {"max_new_tokens": budget, "eos_token_id": self._stop_ids,
                              "pad_token_id": pad, "return_dict_in_generate": True, "output_logits": True}
        kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if self.temperature > 0:  # greedy over Gumbel-perturbed logits is sampling, seeded per row
            kw["logits_processor"] = LogitsProcessorList([_RowGumbel(keys, self.temperature, self.top_p)])
        with torch.no_grad():
            out = self.model.generate(input_ids=input_ids.to(self.device), attention_mask=attn.to(self.device),
                                      **kw)
        seqs = out.sequences[:, width:].cpu()
        logits = torch.stack(out.logits, dim=1).float().cpu() if out.logits else None
        results = []
        for i in range(len(prompts)):
            ids = seqs[i].tolist()
            finish = "length"
            for j, t in enumerate(ids):
                if t in self._stop_ids:
                    ids = ids[: j + 1]
                    finish = "stop"
                    break
            lps: list[float] = []
            if logits is not None and ids:
                lp = torch.log_softmax(logits[i, : len(ids)], dim=-1)
                lps = lp.gather(1, torch.tensor(ids).unsqueeze(1)).squeeze(1).tolist()
            results.append((ids, lps, finish))
        return results
