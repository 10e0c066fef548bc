"""What a policy is: something that answers a conversation with one assistant message.

Every policy (reference replay, OpenAI-compatible endpoint, in-process transformers, vLLM) implements `Policy`.
Errors are typed by the boundary they cross: `ModelError` (the model produced something unusable: a row with
verdict model_error), `EndpointError` (the endpoint failed after retries: a row with verdict infra_error, to be
retried), `ContextLengthError` (the conversation no longer fits: model_error, not retried). A reply whose text
is merely bad (a malformed tool call, nothing at all) is not an error here: the policy returns the message the
conversation codec (warehouse.chat) reads from it and the episode loop judges it, so the turn stays in the row.
This module holds no policy implementation.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel, Field

from tasks.spec import Task
from warehouse.record import Message, Source


class PolicyReply(BaseModel):
    message: Message
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    finish_reason: str | None = None
    token_ids: list[int] | None = Field(default=None, description="Completion token ids, when returned.")
    logprobs: list[float] | None = Field(default=None, description="Completion token logprobs, when returned.")
    prompt_token_ids: list[int] | None = Field(default=None, description="The prompt's token ids exactly as the "
                                                                         "model saw them, when known.")
    chat_template_hash: str | None = Field(default=None, description="warehouse.chat.template_hash of the template "
                                                                     "that rendered the prompt, when known.")
    model_version: str | None = Field(default=None, description="The answering model's version (a checkpoint's "
                                                                "content hash, the served model id), when known.")


class PolicyError(Exception):
    """Base of errors a policy raises."""


class ModelError(PolicyError):
    """The model's output cannot be used at all (a response without a choice; an empty reply is the loop's EmptyReply)."""


class ContextLengthError(ModelError):
    """The prompt no longer fits the model's context; retrying cannot help."""


class EndpointError(PolicyError):
    """The endpoint could not answer after bounded retries (down, 5xx, timeouts): infrastructure."""


class RequestRejected(EndpointError):
    """The endpoint refused the request for a reason retrying cannot fix (401/403/404/422, a 400 that is not
    about context length): infrastructure (a wrong key, model name or server option), so the rollout runner
    does not retry it; the message names the status and the fix."""


class PolicySetupError(PolicyError):
    """A policy cannot be built here (optional package missing, model folder absent); the message names the fix."""


class Policy(Protocol):
    name: str
    source: Source
    endpoint: str | None

    @property
    def sampling(self) -> dict[str, Any]: ...

    async def reply(self, messages: list[Message], tools: list[dict[str, Any]], *, task: Task,
                    sample_index: int) -> PolicyReply: ...
