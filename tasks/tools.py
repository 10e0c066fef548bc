"""Tools a task can expose to a policy: their JSON schemas (OpenAI function format) and how a call runs.

A tool call runs inside the episode's sandbox; its observation is the text handed back to the model.
This module does not talk to policies or verify anything.
"""

from __future__ import annotations

import json
from typing import Any

from sandbox.result import ExecResult, Sandbox

PYTHON_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python 3 code in a sandbox and return what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source to run."}},
            "required": ["code"],
        },
    },
}

TOOLS: dict[str, dict[str, Any]] = {"python": PYTHON_TOOL}

OBSERVATION_LIMIT = 2000  # characters of tool output shown to the model


class ToolArgumentError(ValueError):
    """The model called a tool with a name or arguments that cannot run (a model_error, not a crash)."""


def tool_schemas(names: list[str]) -> list[dict[str, Any]]:
    try:
        return [TOOLS[n] for n in names]
    except KeyError as e:
        raise ValueError(f"unknown tool {e.args[0]!r}; known tools: {sorted(TOOLS)}") from None


def parse_arguments(name: str, arguments: str) -> dict[str, Any]:
    """Decode a tool call's JSON arguments and check them against the tool's required fields."""
    if name not in TOOLS:
        raise ToolArgumentError(f"unknown tool {name!r}")
    try:
        args = json.loads(arguments) if arguments else {}
    except json.JSONDecodeError as e:
        raise ToolArgumentError(f"arguments of {name!r} are not valid JSON: {e}") from None
    if not isinstance(args, dict):
        raise ToolArgumentError(f"arguments of {name!r} must be a JSON object")
    params = TOOLS[name]["function"]["parameters"]
    missing = [k for k in params.get("required", []) if k not in args]
    if missing:
        raise ToolArgumentError(f"tool {name!r} is missing argument(s) {missing}")
    for k, v in args.items():
        if params["properties"].get(k, {}).get("type") == "string" and not isinstance(v, str):
            raise ToolArgumentError(f"argument {k!r} of {name!r} must be a string")
    return args


def run_tool(sandbox: Sandbox, name: str, args: dict[str, Any]) -> ExecResult:
    if name == "python":
        return sandbox.run_python(args["code"])
    raise ToolArgumentError(f"unknown tool {name!r}")


def observation(result: ExecResult) -> str:
    """The text the model sees after a tool call."""
    if result.verdict == "timeout":
        text = result.stdout + result.stderr + "\n[timed out]"
    elif result.verdict == "resource_limit":
        text = result.stdout + result.stderr + "\n[killed: resource limit]"
    else:
        text = result.stdout + result.stderr
    text = text.strip()
    if len(text) > OBSERVATION_LIMIT or result.truncated:
        text = text[:OBSERVATION_LIMIT] + "\n[output truncated]"
    return text
