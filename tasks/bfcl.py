"""BFCL v4 multi-turn (base) from the `bfcl-eval` wheel: its tasks, its executable API classes, its own checker.

- `wheel_path(fetch=True)`: the bfcl-eval wheel (version BFCL_VERSION) in the cache (FLYWHEEL_BFCL_CACHE, default
  ~/.cache/flywheel/bfcl). On first use it is fetched with `pip download --no-deps` (the only download; the
  package is never installed: its dependencies pin numpy 1.26.4 and pull dozens of SDKs). A failed fetch is a
  BfclMissing naming the one command that fixes it.
- `api_imports(wheel)`: per executable API class, the non-standard-library modules its source (and the sources it
  imports from the wheel) needs; a class with any is left out, and so is every task that involves it.
- `load_entries(wheel)`: the base multi-turn entries (question turns, initial_config, involved_classes, and the
  possible_answer ground truth joined by id) that need only standard-library classes, plus the left-out count.
- `load_bfcl(n, split="heldout")`: those entries as flywheel Tasks (suite `bfcl-multi-turn`): the first user turn as
  the prompt, the later ones as Task.later_turns, the functions as tools with the schemas BFCL offers an OpenAI-style
  model (`openai_tools`, a port of its convert_to_tool) in Task.tool_specs, the ground-truth calls as the
  reference, turn by turn; the initial state, classes, docs and ground truth in metadata.
- `check(entry, model_turns)`: BFCL's own `multi_turn_checker` (eval_checker/multi_turn_eval in the wheel), imported
  from the wheel file itself: per turn it runs the model's calls and the ground truth's on separate instances
  loaded from initial_config, then the state check (every public attribute of every instance equals the ground
  truth's) and the response check (the ground truth's results are an unordered sub-multiset of all the model's
  results so far). `replay(entry, drop=None)` checks the ground truth itself, with one call left out if asked.
- `check_in_sandbox(entry, model_turns, backend)`: the same checker run inside one fresh sandbox: the wheel's
  checker and the entry's class sources are written to its workspace and its python3 runs them.
- Episodes (agents/loop.py calls these): `acquire(task, backend)` a sandbox whose workspace holds the task's class
  sources; `run_call(sandbox, name, args)` one call as BFCL's inference loop executes it (its
  execute_multi_turn_func_call on the call string `call_string` builds), in a fresh process of that sandbox, the
  instances kept between calls in a pickle in the workspace; `verify_bfcl(task, messages, backend)` the episode's
  calls per user turn (`model_turns`) through `check_in_sandbox` (the `bfcl` verifier kind); `dropped_calls` the
  episode with one call left out, the verifier audit's mutants.
`check` runs the classes in the calling process (BFCL's checker `eval`s call strings, as BFCL does); episodes and
their verdicts run them only in sandboxes. This module never writes the data anywhere but the cache (and a
sandbox's workspace).
"""

from __future__ import annotations

import ast
import copy
import functools
import inspect
import json
import os
import secrets
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path
from typing import Any

from sandbox.result import Backend, ExecResult, SandboxError
from tasks import pyast
from tasks.spec import ReferenceSolution, Task, ToolCallStep, VerifierSpec
from warehouse.record import Message

BFCL_VERSION = "2026.3.23"
SUITE = "bfcl-multi-turn"
_CHECKER = ("bfcl_eval/eval_checker/multi_turn_eval/multi_turn_checker.py",
            "bfcl_eval/eval_checker/multi_turn_eval/multi_turn_utils.py",
            "bfcl_eval/constants/executable_backend_config.py")
_QUESTIONS = "bfcl_eval/data/BFCL_v4_multi_turn_base.json"
_ANSWERS = "bfcl_eval/data/possible_answer/BFCL_v4_multi_turn_base.json"
_DOCS = "bfcl_eval/data/multi_turn_func_doc/"
_TYPE_MAPPINGS = "bfcl_eval/constants/type_mappings.py"
TURN_DONE = "Done."  # the reference's message that ends each turn
BFCL_VERIFIER_VERSION = "1"
STATE_FILE = "bfcl_state.pkl"  # the API instances between calls, in the episode's workspace
ENTRY_FILE = "bfcl_entry.json"


class BfclError(ValueError):
    """A request the BFCL loader refuses (a split it does not have, a suite it cannot roll out)."""


class BfclMissing(BfclError):
    """The bfcl-eval wheel is missing, or holds something this loader cannot run."""


class BfclFetchFailed(BfclMissing):
    """`pip download` could not fetch the wheel (registry unreachable, version gone)."""


def cache_dir() -> Path:
    return Path(os.environ.get("FLYWHEEL_BFCL_CACHE") or Path.home() / ".cache" / "flywheel" / "bfcl")


def fetch_command() -> str:
    return f"pip download --no-deps bfcl-eval=={BFCL_VERSION} -d {cache_dir()}"


def wheel_path(fetch: bool = True) -> Path:
    """The cached wheel; fetched without dependencies on first use (fetch=False: a BfclMissing instead)."""
    wheel = cache_dir() / f"bfcl_eval-{BFCL_VERSION}-py3-none-any.whl"
    if wheel.is_file():
        if not zipfile.is_zipfile(wheel):
            raise BfclMissing(f"{wheel} is not a wheel (a broken download?); delete it and fetch it again: "
                              f"rm {wheel} && {fetch_command()}")
        return wheel
    if not fetch:
        raise BfclMissing(f"the bfcl-eval {BFCL_VERSION} wheel is not in {cache_dir()}; fetch it: {fetch_command()}")
    cache_dir().mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           f"bfcl-eval=={BFCL_VERSION}", "-d", str(cache_dir())]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise BfclFetchFailed(f"could not fetch the bfcl-eval {BFCL_VERSION} wheel ({' | '.join(tail)}); "
                          f"fetch it with: {fetch_command()}")
    return wheel


def _read(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as zf:
        return zf.read(name).decode("utf-8")


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _imports(source: str) -> set[str]:
    """Absolute module names a source imports (any depth of the tree: imports inside functions count too)."""
    out: set[str] = set()
    for node in ast.walk(pyast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
    return out


def _needs(wheel: Path, module: str, seen: set[str] | None = None) -> set[str]:
    """Non-standard-library top-level modules `module` (a module of the wheel) needs, through the wheel's own."""
    seen = set() if seen is None else seen
    if module in seen:
        return set()
    seen.add(module)
    missing: set[str] = set()
    for name in _imports(_read(wheel, module.replace(".", "/") + ".py")):
        top = name.split(".")[0]
        if top == "bfcl_eval":
            missing |= _needs(wheel, name, seen)
        elif top not in sys.stdlib_module_names:
            missing.add(top)
    return missing


def _backend_config(wheel: Path) -> dict[str, Any]:
    """The wheel's constants/executable_backend_config.py (pure literals: class -> module, class -> doc file)."""
    ns: dict[str, Any] = {}
    exec(compile(_read(wheel, _CHECKER[2]), _CHECKER[2], "exec"), ns)  # noqa: S102 - constants only
    return ns


def _class_modules(wheel: Path) -> dict[str, str]:
    """BFCL's CLASS_FILE_PATH_MAPPING: class name -> module."""
    return dict(_backend_config(wheel)["CLASS_FILE_PATH_MAPPING"])


@functools.lru_cache(maxsize=4)
def api_imports(wheel: Path) -> dict[str, list[str]]:
    """Class name -> the non-standard-library modules it needs ([] = runs on the standard library alone)."""
    return {cls: sorted(_needs(wheel, mod)) for cls, mod in _class_modules(wheel).items()}  # callers: do not mutate


@functools.lru_cache(maxsize=4)
def _checker_stdlib_only(wheel: Path) -> None:
    for path in _CHECKER[:2]:
        need = _needs(wheel, path.removesuffix(".py").replace("/", "."))
        if need:
            raise BfclMissing(f"BFCL's checker {path} in {wheel.name} needs {sorted(need)} beyond the standard "
                              "library; this loader runs it on the standard library only")


def _import_from_wheel(wheel: Path, module: str) -> Any:
    """Import `module` from the wheel file itself (zipimport; the wheel's __init__ files are empty)."""
    import importlib

    if str(wheel) not in sys.path:
        sys.path.append(str(wheel))
    mod = importlib.import_module(module)
    if not str(getattr(mod, "__file__", "")).startswith(str(wheel)):
        raise BfclMissing(f"{module} was imported from {mod.__file__}, not from {wheel}; an installed bfcl_eval "
                          "shadows the cached wheel: pip uninstall bfcl-eval")
    return mod


def load_entries(wheel: Path | None = None) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The base entries whose classes need only the standard library (with 'ground_truth'), and left-out counts
    per excluded class (a task is counted once, under the first excluded class it involves)."""
    wheel = wheel or wheel_path()
    answers = {a["id"]: a["ground_truth"] for a in _json_lines(_read(wheel, _ANSWERS))}
    needs = api_imports(wheel)
    kept: list[dict[str, Any]] = []
    left_out: dict[str, int] = {}
    for entry in _json_lines(_read(wheel, _QUESTIONS)):
        bad = [c for c in entry["involved_classes"] if needs.get(c, ["(unknown class)"])]
        if bad:
            left_out[bad[0]] = left_out.get(bad[0], 0) + 1
            continue
        if entry["id"] not in answers:
            raise BfclMissing(f"{_QUESTIONS} entry {entry['id']} has no ground truth in {_ANSWERS} ({wheel.name})")
        kept.append({**entry, "ground_truth": answers[entry["id"]]})
    return kept, left_out


def function_docs(wheel: Path, classes: list[str]) -> list[dict[str, Any]]:
    """The function docs of the given classes, as the wheel's multi_turn_func_doc holds them."""
    files = _backend_config(wheel)["MULTI_TURN_FUNC_DOC_FILE_MAPPING"]
    return [doc for c in classes for doc in _json_lines(_read(wheel, _DOCS + files[c]))]


def _call_step(call: str, methods: dict[str, Any]) -> ToolCallStep:
    """A ground-truth call string as a tool call (positional arguments named by the method's signature)."""
    node = pyast.parse(call, mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise BfclError(f"ground-truth call {call!r} is not a plain function call")
    name = node.func.id
    args = [ast.literal_eval(a) for a in node.args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg}
    if args:
        sig = inspect.signature(methods[name])  # a class's function: drop `self`
        sig = sig.replace(parameters=list(sig.parameters.values())[1:])
        bound = sig.bind_partial(*args, **kwargs)
        kwargs = dict(bound.arguments)
    return ToolCallStep(tool=name, arguments=kwargs)


def _cast_types(props: dict[str, Any], mapping: dict[str, str]) -> dict[str, Any]:
    """BFCL's _cast_to_openai_type (model_handler/utils.py, which needs tenacity: ported, not imported)."""
    for value in props.values():
        if "type" not in value:
            value["type"] = "string"
        else:
            if value["type"] == "float":
                value["format"] = "float"
                value["description"] += " This is a float type value."
            value["type"] = mapping.get(value["type"], "string")
        if value["type"] in ("array", "object"):
            if "properties" in value:
                value["properties"] = _cast_types(value["properties"], mapping)
            elif "items" in value:
                items = value["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_types(items["properties"], mapping)
    return props


def openai_tools(wheel: Path, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The function docs as BFCL offers them to an OpenAI-style function-calling model (its convert_to_tool,
    ModelStyle.OPENAI_COMPLETIONS, with the wheel's GORILLA_TO_OPENAPI type mapping)."""
    ns: dict[str, Any] = {}
    exec(compile(_read(wheel, _TYPE_MAPPINGS), _TYPE_MAPPINGS, "exec"), ns)  # noqa: S102 - dict literals only
    out = []
    for doc in copy.deepcopy(docs):
        doc["parameters"]["type"] = "object"
        doc["parameters"]["properties"] = _cast_types(doc["parameters"]["properties"], ns["GORILLA_TO_OPENAPI"])
        out.append({"type": "function", "function": doc})
    return out


def load_bfcl(n: int | None = None, wheel: Path | None = None, split: str = "heldout") -> list[Task]:
    """The first n loadable base entries as Tasks (all of them when n is None); all are heldout."""
    if split != "heldout":
        raise BfclError(f"{SUITE} is BFCL's evaluation set: every task is heldout, none is {split}; "
                        "ask for split heldout (--split heldout)")
    if n is not None and n < 0:
        raise BfclError(f"n must be >= 0, not {n}")
    wheel = wheel or wheel_path()
    entries, left_out = load_entries(wheel)
    if n is not None and n > len(entries):
        raise BfclError(f"{SUITE} holds {len(entries)} loadable tasks ({sum(left_out.values())} left out: "
                        f"{left_out}); asked for {n}: ask for fewer")
    classes = {c: getattr(_import_from_wheel(wheel, m), c) for c, m in _class_modules(wheel).items()
               if c in {k for e in entries for k in e["involved_classes"]}}
    tasks = []
    for e in entries[: n if n is not None else len(entries)]:
        methods = {name: fn for c in e["involved_classes"] for name, fn in inspect.getmembers(classes[c])
                   if callable(fn) and not name.startswith("_")}
        docs = function_docs(wheel, e["involved_classes"])
        turns = ["\n".join(m["content"] for m in turn if m["role"] == "user") for turn in e["question"]]
        if len(turns) != len(e["ground_truth"]):
            raise BfclMissing(f"{e['id']} has {len(turns)} user turns but {len(e['ground_truth'])} ground-truth "
                              f"turns in {wheel.name}")
        refs = [ReferenceSolution(steps=[_call_step(c, methods) for c in turn], final=TURN_DONE)
                for turn in e["ground_truth"]]
        tasks.append(Task(
            id=e["id"], suite=SUITE, version=f"bfcl-eval-{BFCL_VERSION}", split="heldout",
            prompt=turns[0], later_turns=turns[1:], tools=[d["name"] for d in docs],
            tool_specs=openai_tools(wheel, docs), verifier=VerifierSpec(kind="bfcl"),
            reference=refs[0].model_copy(update={"later_turns": refs[1:]}),
            metadata={"turns": [[m["content"] for m in turn if m["role"] == "user"] for turn in e["question"]],
                      "initial_config": e["initial_config"], "involved_classes": e["involved_classes"],
                      "function_docs": docs, "ground_truth": e["ground_truth"], "left_out": left_out}))
    return tasks


def _require_stdlib(wheel: Path, entry: dict[str, Any]) -> None:
    """BfclMissing unless BFCL's checker and every class the entry involves run on the standard library alone."""
    _checker_stdlib_only(wheel)
    needs = api_imports(wheel)
    beyond = {c: needs.get(c, ["(not a BFCL class)"]) for c in entry["involved_classes"]}
    if any(beyond.values()):
        raise BfclMissing(f"{entry['id']} involves classes that need more than the standard library: "
                          f"{ {c: m for c, m in beyond.items() if m} }; this loader leaves such tasks out")


def check(entry: dict[str, Any], model_turns: list[list[str]], wheel: Path | None = None) -> dict[str, Any]:
    """BFCL's multi_turn_checker on one entry: `model_turns` holds, per turn, the model's call strings (one step).

    Returns the checker's dict ({'valid': True} or valid False with error_type and error_message)."""
    wheel = wheel or wheel_path()
    _require_stdlib(wheel, entry)
    checker = _import_from_wheel(wheel, _CHECKER[0].removesuffix(".py").replace("/", "."))
    utils = _import_from_wheel(wheel, _CHECKER[1].removesuffix(".py").replace("/", "."))
    model = f"flywheel_{uuid.uuid4().hex}"  # BFCL keeps instances in its module globals, keyed by model name
    try:
        return checker.multi_turn_checker([[turn] for turn in model_turns], entry["ground_truth"], entry,
                                          entry["id"].rsplit("_", 1)[0], model)
    finally:
        for key in [k for k in vars(utils) if k.startswith(model)]:
            del vars(utils)[key]


def replay(entry: dict[str, Any], drop: tuple[int, int] | None = None, wheel: Path | None = None) -> dict[str, Any]:
    """Check the entry's own ground truth; `drop=(turn, index)` leaves that one call out first."""
    turns = [list(t) for t in entry["ground_truth"]]
    if drop is not None:
        del turns[drop[0]][drop[1]]
    return check(entry, turns, wheel)


@functools.cache
def _guest(name: str) -> str:
    """The source of an in-sandbox program of tasks/guest/ (bfcl_check.py, bfcl_call.py), sent as `python3 -I -c`."""
    return (Path(__file__).with_name("guest") / name).read_text()


def _sandbox_files(wheel: Path, classes: list[str]) -> dict[str, str]:
    """The wheel's sources BFCL's checker needs for these classes (with every package __init__ on the way)."""
    mods = {p.removesuffix(".py").replace("/", ".") for p in _CHECKER}
    todo = [_class_modules(wheel)[c] for c in classes]
    while todo:
        m = todo.pop()
        if m not in mods:
            mods.add(m)
            todo += [n for n in _imports(_read(wheel, m.replace(".", "/") + ".py")) if n.startswith("bfcl_eval.")]
    paths = {m.replace(".", "/") + ".py" for m in mods}
    for m in list(mods):
        parts = m.split(".")
        paths |= {"/".join(parts[:i]) + "/__init__.py" for i in range(1, len(parts))}
    return {p: _read(wheel, p) for p in sorted(paths)}


def check_in_sandbox(entry: dict[str, Any], model_turns: list[list[str]], backend: Backend,
                     wheel: Path | None = None) -> dict[str, Any]:
    """`check`, run inside one fresh sandbox of `backend` (acquire, one exec, close): the wheel's checker and the
    entry's API classes as source files in its workspace, its python3 running them. Returns valid, error_type and
    error_message; a sandbox that fails is a SandboxError, never a verdict."""
    wheel = wheel or wheel_path()
    _require_stdlib(wheel, entry)
    marker = "__BFCL_" + secrets.token_hex(8)
    files = _sandbox_files(wheel, entry["involved_classes"])
    files["bfcl_job.json"] = json.dumps({"entry": entry, "model_turns": model_turns})
    sandbox = backend.acquire()
    try:
        sandbox.write_files(files)
        res = sandbox.exec(["python3", "-I", "-c", _guest("bfcl_check.py"), marker])
    finally:
        try:
            sandbox.close()
        except SandboxError:
            pass
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(marker + " ")]
    if res.verdict == "infra_error" or res.exit_code != 0 or not lines:
        raise SandboxError(f"BFCL's checker did not finish in the sandbox for {entry['id']}: exit {res.exit_code}, "
                           f"{res.error or res.stderr[-500:]}")
    return json.loads(lines[-1][len(marker) + 1:])


# ------------------------------------------------------------------------------------------------ episodes


def task_entry(task: Task) -> dict[str, Any]:
    """The BFCL entry a Task was loaded from (what the checker reads): id, initial_config, classes, ground truth."""
    md = task.metadata
    return {"id": task.id, "initial_config": md["initial_config"], "involved_classes": md["involved_classes"],
            "ground_truth": md["ground_truth"]}


def call_string(name: str, args: dict[str, Any]) -> str:
    """A decoded tool call as BFCL's call string (its convert_to_function_call: `name(k=repr(v),...)`)."""
    return f"{name}({','.join(f'{k}={v!r}' for k, v in args.items())})"


def acquire(task: Task, backend: Backend, wheel: Path | None = None):
    """The episode's sandbox from `backend`, its workspace holding the task's API classes (the wheel's sources) and
    its entry; the instances are made from initial_config at the first call and kept in STATE_FILE between calls."""
    wheel = wheel or wheel_path()
    entry = task_entry(task)
    _require_stdlib(wheel, entry)
    files = _sandbox_files(wheel, entry["involved_classes"])
    files[ENTRY_FILE] = json.dumps({k: entry[k] for k in ("id", "initial_config", "involved_classes")})
    sandbox = backend.acquire()
    try:
        sandbox.write_files(files)
    except BaseException:
        sandbox.close()
        raise
    return sandbox


def run_call(sandbox: Any, name: str, args: dict[str, Any], *, timeout_s: float | None = None) -> ExecResult:
    """One of the task's API functions called in the episode's sandbox, as BFCL's inference loop executes it; the
    result (BFCL's string, 'Error during execution: ...' for a call that raised) is the stdout. A run that gives no
    result (not a timeout) is a SandboxError: the machinery broke, not the model."""
    marker = "__BFCL_" + secrets.token_hex(8)
    res = sandbox.exec(["python3", "-I", "-c", _guest("bfcl_call.py"), marker, STATE_FILE, ENTRY_FILE],
                       stdin=call_string(name, args).encode(), timeout_s=timeout_s)
    if res.verdict in ("timeout", "resource_limit", "infra_error"):
        return res
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith(marker + " ")]
    if res.exit_code != 0 or not lines:
        raise SandboxError(f"BFCL call {name} gave no result in the sandbox: exit {res.exit_code}, "
                           f"{(res.stderr or res.error or '')[-500:]}")
    return res.model_copy(update={"stdout": json.loads(lines[-1][len(marker) + 1:]), "stderr": ""})


def model_turns(task: Task, messages: list[Message]) -> list[list[str]]:
    """The episode's calls per user turn, as BFCL call strings (one list per ground-truth turn; turns the episode
    never reached are empty). A call whose arguments do not decode is left out, as BFCL's decoder leaves it."""
    turns: list[list[str]] = []
    earlier_users = sum(m.role == "user" for m in task.messages or [])
    seen = 0
    for m in messages:
        if m.role == "user":
            seen += 1
            if seen > earlier_users:
                turns.append([])
        elif m.role == "assistant" and turns:
            for tc in m.tool_calls or []:
                try:
                    args = json.loads(tc.function.arguments or "{}")
                except ValueError:
                    continue
                if isinstance(args, dict):
                    turns[-1].append(call_string(tc.function.name, args))
    n = len(task.metadata["ground_truth"])
    return (turns + [[] for _ in range(n)])[:n]


def verify_bfcl(task: Task, messages: list[Message], backend: Backend | None) -> tuple[bool, dict[str, Any]]:
    """BFCL's checker on the episode's calls, in a fresh sandbox of `backend` (check_in_sandbox): it runs them
    again on fresh instances beside the ground truth and compares, per turn, the state and the results."""
    from tasks.judge.errors import VerifierUnavailable

    if backend is None:
        raise VerifierUnavailable(f"task {task.id} is judged by BFCL's checker in a sandbox; pass backend=")
    turns = model_turns(task, messages)
    got = check_in_sandbox(task_entry(task), turns, backend)
    return bool(got.get("valid")), {"checker": got, "model_calls": turns}


def dropped_calls(messages: list[Message]) -> list[list[Message]]:
    """Mutants of an episode for the verifier audit: one per tool call, the episode with that call (and the tool
    message answering it) left out; an assistant message left with no call keeps its place, empty of calls."""
    out = []
    for i, m in enumerate(messages):
        for j, call in enumerate(m.tool_calls or [] if m.role == "assistant" else []):
            rest = [c for k, c in enumerate(m.tool_calls or []) if k != j]
            out.append([*messages[:i], m.model_copy(update={"tool_calls": rest or None}),
                        *[x for x in messages[i + 1:] if not (x.role == "tool" and x.tool_call_id == call.id)]])
    return out
