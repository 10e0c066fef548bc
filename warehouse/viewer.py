"""The read-only queries behind `flywheel view`: runs, rounds, episode lists, one episode, a task, a snapshot.

Every function takes a connection from `open_view` (query.connect's in-memory DuckDB views over the lake, then
locked: file access limited to the lake's folder, configuration frozen) and returns plain dicts and lists for the
pages. All values reach SQL as parameters; sort columns come from a fixed list. The one deliberate exception is
the user's free `WHERE` of the episode list: it is checked to be one SELECT over the trajectories view (DuckDB's
own parser), then run inside a subquery on the locked connection. Errors are ViewError with an HTTP status and a
message that names the input and the fix. This module renders nothing and writes nothing.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from warehouse import chat
from warehouse.lakefs import open_lake
from warehouse.query import connect
from warehouse.score import PASS_RATE_SQL, pass_at_k
from warehouse.tables import TRAJECTORIES_DIR

PAGE_SIZES = (25, 50, 100, 200)
# Deepest row position whose page is bounded by its sort value (page_rows); deeper pages run the plain query.
BOUND_MAX_ROWS = 100_000
# Columns of the episode list, in display order; every one of them can be sorted on.
LIST_COLUMNS = ("trajectory_id", "run_id", "round", "source", "policy", "suite", "split", "task_id", "verdict",
                "hack_flags", "reward", "turns", "n_tool_calls", "prompt_tokens", "completion_tokens", "latency_ms",
                "created_at")
SORTABLE = frozenset(LIST_COLUMNS) - {"hack_flags"}
# Equality filters of the episode list: query-string name -> column.
FILTERS = ("run_id", "round", "source", "policy", "suite", "split", "verdict", "task_id")


class ViewError(Exception):
    """A page cannot be shown: unknown root or id, bad filter or WHERE. `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400, title: str = "Bad request"):
        super().__init__(message)
        self.status = status
        self.title = title


def check_root(root: str) -> str:
    """The root, if it can be a lake; a local folder must exist (a typo would read as an empty lake)."""
    if "://" not in root and not Path(root).is_dir():
        raise ViewError(f"lake root {root} does not exist; pass the --root a run wrote to (its --out)", 404,
                        "Unknown lake root")
    return root


def open_view(root: str) -> duckdb.DuckDBPyConnection:
    """query.connect(root, read_only=True) (a corrupt file is skipped with a warning, not moved), then locked for
    reading: a local lake's connection may touch no file outside the lake's folder, and no setting can change."""
    check_root(root)
    con = connect(root, read_only=True)
    lake = open_lake(root)
    if lake.local:
        base = os.path.abspath(lake.base).rstrip("/") + "/"
        con.execute("SET allowed_directories = ?", [[base]])
        con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]


def _one(con: duckdb.DuckDBPyConnection, sql: str, key: str, missing: str, title: str) -> dict[str, Any]:
    """The one row `sql` finds for `key`, or a 404 ViewError with the message `missing`."""
    found = _rows(con, sql, [key])
    if not found:
        raise ViewError(missing, 404, title)
    return found[0]


def _json(text: str | None, default: Any) -> Any:
    if not text:
        return default
    try:
        return json.loads(text)
    except ValueError:
        return default


# ----------------------------------------------------------------------------- runs and rounds
def lake_summary(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    return _rows(con, """SELECT (SELECT count(*) FROM trajectories) AS episodes,
                                (SELECT count(*) FROM datasets) AS snapshots,
                                (SELECT count(*) FROM rounds) AS round_metrics""")[0]


def runs(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """One row per run: rounds, episodes, pass rate of scored episodes, hacks, snapshots, first and last write."""
    return _rows(con, f"""
        WITH t AS (SELECT run_id, count(DISTINCT round) AS rounds, count(*) AS episodes,
                          {PASS_RATE_SQL} AS pass_rate,
                          count(*) FILTER (WHERE verdict = 'hack') AS hacks,
                          min(created_at) AS first_at, max(created_at) AS last_at
                   FROM trajectories GROUP BY run_id),
             d AS (SELECT run_id, count(*) AS snapshots FROM datasets GROUP BY run_id),
             r AS (SELECT DISTINCT run_id FROM rounds)
        SELECT coalesce(t.run_id, d.run_id, r.run_id) AS run_id, coalesce(t.rounds, 0) AS rounds,
               coalesce(t.episodes, 0) AS episodes, t.pass_rate, coalesce(t.hacks, 0) AS hacks,
               coalesce(d.snapshots, 0) AS snapshots, t.first_at, t.last_at
        FROM t FULL JOIN d USING (run_id) FULL JOIN r USING (run_id) ORDER BY last_at DESC NULLS LAST, run_id""")


def run_rounds(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, Any]:
    """A run's page: episodes per round and source, the rounds table (held-out pass@k first), its snapshots."""
    episodes = _rows(con, f"""
        SELECT round::INTEGER AS round, source, count(*) AS episodes,
               {PASS_RATE_SQL} AS pass_rate,
               count(*) FILTER (WHERE verdict = 'hack') AS hacks,
               count(*) FILTER (WHERE verdict = 'infra_error') AS infra_errors,
               sum(prompt_tokens + completion_tokens) AS tokens, sum(cost_usd) AS cost_usd
        FROM trajectories WHERE run_id = ? GROUP BY ALL ORDER BY round, source""", [run_id])
    metrics = _rows(con, """
        SELECT * FROM (SELECT round::INTEGER AS round, stage, subject, split, suite, metric,
                              arg_max(value, created_at) AS value
                       FROM rounds WHERE run_id = ? GROUP BY ALL)
        ORDER BY round, (split = 'heldout' AND metric LIKE 'pass@%') DESC, stage, subject, suite, metric""",
                    [run_id])
    snaps = _rows(con, """SELECT snapshot_id, round::INTEGER AS round, n_rows, created_at FROM datasets
                          WHERE run_id = ? ORDER BY round, created_at""", [run_id])
    if not episodes and not metrics and not snaps:
        raise ViewError(f"run {run_id!r} is not in this lake: pick one from the runs page (/)", 404, "Unknown run")
    return {"run_id": run_id, "episodes": episodes, "metrics": metrics, "snapshots": snaps}


def report_plots(root: str, run_id: str) -> list[str]:
    """Names of the PNG plots the run's report wrote (ROOT/runs/RUN_ID/report/), if any; local roots only."""
    folder = report_folder(root, run_id)
    if folder is None or not folder.is_dir():
        return []
    return sorted(p.name for p in folder.glob("*.png"))


def report_folder(root: str, run_id: str) -> Path | None:
    lake = open_lake(root)
    if not lake.local or not re.fullmatch(r"[A-Za-z0-9._-]+", run_id) or run_id in (".", ".."):
        return None
    return Path(lake.base) / "runs" / run_id / "report"


# ----------------------------------------------------------------------------- the episode list
@dataclass
class EpisodeQuery:
    """The episode list's filters, sort and page, as read from the query string."""

    filters: dict[str, str] = field(default_factory=dict)
    hack: str | None = None
    where: str | None = None
    sort: str = "created_at"
    desc: bool = True
    page: int = 1
    per_page: int = 50

    def __post_init__(self) -> None:
        self.filters = {k: v for k, v in self.filters.items() if v not in (None, "")}
        unknown = set(self.filters) - set(FILTERS)
        if unknown:
            raise ViewError(f"unknown filter {sorted(unknown)}: use {', '.join(FILTERS)}, hack or where")
        if "round" in self.filters and not re.fullmatch(r"\d+", str(self.filters["round"])):
            raise ViewError(f"round must be a whole number, not {self.filters['round']!r}")
        if self.sort not in SORTABLE:
            raise ViewError(f"cannot sort by {self.sort!r}: use one of {', '.join(sorted(SORTABLE))}")
        if self.page < 1:
            raise ViewError(f"page must be 1 or more, not {self.page}")
        if self.per_page not in PAGE_SIZES:
            raise ViewError(f"per_page must be one of {', '.join(map(str, PAGE_SIZES))}, not {self.per_page}")
        self.hack = self.hack or None
        self.where = (self.where or "").strip() or None


def _where_subquery(where: str) -> str:
    """The subquery that applies the user's WHERE (newlines keep a trailing `--` comment from eating the ')')."""
    return f"SELECT * FROM trajectories WHERE (\n{where}\n)"


def check_where(con: duckdb.DuckDBPyConnection, where: str) -> str:
    """The user's WHERE, if it is an expression over the trajectories view: the very subquery the list runs must
    be one plain SELECT (no set operation, no second statement). Raises ViewError naming the problem."""
    sql = _where_subquery(where)
    try:
        stmts = con.extract_statements(sql)
        if len(stmts) != 1 or stmts[0].type != duckdb.StatementType.SELECT:
            raise ViewError(f"WHERE {where!r} must be one condition, e.g. verdict = 'fail' AND round = 1")
        tree = json.loads(con.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    except duckdb.Error as e:
        raise ViewError(f"WHERE {where!r} does not parse: {str(e).splitlines()[0]}") from e
    if tree.get("error"):
        raise ViewError(f"WHERE {where!r} does not parse: {tree.get('error_message', 'syntax error')}")
    node = tree["statements"][0]["node"]
    cte = (node.get("cte_map") or {}).get("map") or []
    if node.get("type") != "SELECT_NODE" or node.get("modifiers") or node.get("group_expressions") or cte \
            or node.get("having") or node.get("qualify") or node.get("sample") \
            or (node.get("from_table") or {}).get("table_name") != "trajectories":
        raise ViewError(f"WHERE {where!r} must be one condition over the trajectories view, "
                        "e.g. reward > 0.5 AND suite = 'arithmetic'")
    return where


def _where_sql(con: duckdb.DuckDBPyConnection, q: EpisodeQuery) -> tuple[str, list[str], list[Any]]:
    """(the relation to read, the filter conditions, their parameters). A user WHERE becomes a subquery the
    relation is read from (one scan that the filters push into, not a semi-join on the ids)."""
    parts, params = [], []
    for col in FILTERS:
        if col in q.filters:
            parts.append(f'"{col}" = ?')
            params.append(int(q.filters[col]) if col == "round" else q.filters[col])
    if q.hack:
        parts.append("list_contains(hack_flags, ?)")
        params.append(q.hack)
    source = f"({_where_subquery(check_where(con, q.where))}) AS trajectories" if q.where else "trajectories"
    return source, parts, params


def _where(parts: list[str]) -> str:
    return (" WHERE " + " AND ".join(parts)) if parts else ""


def _page_sql(source: str, parts: list[str], q: EpisodeQuery) -> str:
    order = f'"{q.sort}" {"DESC" if q.desc else "ASC"} NULLS LAST, trajectory_id'
    cols = ", ".join(f'"{c}"' for c in LIST_COLUMNS)
    return (f"SELECT {cols} FROM {source}{_where(parts)} ORDER BY {order} "
            f"LIMIT {int(q.per_page)} OFFSET {int((q.page - 1) * q.per_page)}")


def list_sql(con: duckdb.DuckDBPyConnection, q: EpisodeQuery) -> tuple[str, str, list[Any]]:
    """(page SQL, count SQL, parameters) of an episode list query: the straightforward form, one statement each
    (what `flywheel sql` would run; episode_list answers the same rows faster)."""
    source, parts, params = _where_sql(con, q)
    return _page_sql(source, parts, q), f"SELECT count(*) FROM {source}{_where(parts)}", params


def page_rows(con: duckdb.DuckDBPyConnection, q: EpisodeQuery) -> tuple[int, list[dict[str, Any]]]:
    """(count, rows of list_sql's page), found in two narrow steps instead of a count and a wide top-N.

    1. One scan of the filter and sort columns only gives the count and the sort value of the page's last row
       (`count(*)` and `max(reward, K)[K]`, K = the last row's position; min() when ascending).
    2. The page query with that value as a bound (`reward >= ?`): a plain comparison DuckDB pushes into the
       Parquet scan (row groups skipped by their min/max, the display columns read only for rows that pass).
    Same rows in the same order as list_sql's page: every row the bound drops sorts after the page's last row
    (a later sort value, or NULL), so the rows before it keep their positions. No bound when the page is not
    full (the last one), reaches the NULLs (max/min skip NULLs: the list is short) or lies past BOUND_MAX_ROWS."""
    source, parts, params = _where_sql(con, q)
    col, first = f'"{q.sort}"', (q.page - 1) * q.per_page
    k = first + q.per_page
    if k > BOUND_MAX_ROWS:
        total = con.execute(f"SELECT count(*) FROM {source}{_where(parts)}", params).fetchall()[0][0]
        last = None
    else:
        total, last = con.execute(f"""SELECT n, CASE WHEN len(top) = {k} THEN top[{k}] END FROM (
                                      SELECT count(*) AS n, {"max" if q.desc else "min"}({col}, {k}) AS top
                                      FROM {source}{_where(parts)})""", params).fetchall()[0]
    if first >= total:
        return total, []
    if last is not None:
        parts, params = [*parts, f"{col} {'>=' if q.desc else '<='} ?"], [*params, last]
    return total, _rows(con, _page_sql(source, parts, q), params)


def episode_list(con: duckdb.DuckDBPyConnection, q: EpisodeQuery) -> dict[str, Any]:
    """One page of episodes matching the query (page_rows), with the total count."""
    try:
        total, rows = page_rows(con, q)
    except duckdb.Error as e:
        what = f"WHERE {q.where!r}" if q.where else "the filters"
        raise ViewError(f"{what} failed: {str(e).splitlines()[0]}") from e
    pages = max(1, -(-total // q.per_page))
    return {"rows": rows, "total": total, "pages": pages}


_CHOICES: dict[str, tuple[tuple, dict[str, list[Any]]]] = {}


def lake_state(root: str) -> tuple:
    """(path, size, mtime) of every trajectory file: changes whenever a writer adds or compacts a file."""
    lake = open_lake(root)
    return tuple((f.path, f.size, f.mtime) for f in lake.list_files(lake.join(TRAJECTORIES_DIR)))


def filter_choices(con: duckdb.DuckDBPyConnection, root: str | None = None) -> dict[str, list[Any]]:
    """Distinct values for the list's drop-downs (one scan of small columns; task ids are typed, not listed).
    With root, remembered until the lake's trajectory files change (a scan of a large lake is not free)."""
    if root is not None:
        state = lake_state(root)
        hit = _CHOICES.get(root)
        if hit is not None and hit[0] == state:
            return hit[1]
        choices = filter_choices(con)
        _CHOICES[root] = (state, choices)
        return choices
    cols = ("run_id", "round", "source", "policy", "suite", "split", "verdict")
    sel = ", ".join(f'list(DISTINCT "{c}" ORDER BY "{c}") AS "{c}"' for c in cols)
    row = _rows(con, f"SELECT {sel}, list(DISTINCT h ORDER BY h) FILTER (WHERE h IS NOT NULL) AS hack "
                     f"FROM (SELECT *, unnest(CASE WHEN len(hack_flags) > 0 THEN hack_flags ELSE [NULL] END) AS h "
                     f"FROM (SELECT {', '.join(cols)}, hack_flags FROM trajectories))")[0]
    return {k: [x for x in (v or []) if x is not None] for k, v in row.items()}


# ----------------------------------------------------------------------------- one episode
def message_reasoning(message: dict[str, Any]) -> tuple[str | None, str]:
    """(reasoning, text) of a stored assistant message, read as the conversation codec reads one (warehouse.chat,
    as `from_chat` does): the record's `reasoning` field, else an opening `<think>...</think>` block of the content
    (`chat.split_reasoning`), whose text is then the rest, stripped; else the content as it is."""
    content = message.get("content") or ""
    if message.get("reasoning"):
        return message["reasoning"], content
    reasoning, rest = chat.split_reasoning(content)
    return reasoning, rest.strip() if rest != content else content


def episode(con: duckdb.DuckDBPyConnection, trajectory_id: str) -> dict[str, Any]:
    """Everything about one episode: the row, its JSON fields parsed, and the snapshots that used it."""
    row = _one(con, "SELECT * FROM trajectories WHERE trajectory_id = ?", trajectory_id,
               f"episode {trajectory_id!r} is not in this lake: find it in the episode list (/episodes)",
               "Unknown episode")
    row["sampling"] = _json(row.pop("sampling_json"), {})
    row["tools"] = _json(row.pop("tools_json"), [])
    row["reward_terms"] = _json(row.pop("reward_terms_json"), {})
    details = _json(row.pop("verifier_details_json"), {})
    row["forensics"] = details.pop("forensics", []) if isinstance(details, dict) else []
    row["tests"] = details.pop("tests", []) if isinstance(details, dict) else []
    row["verifier_details"] = details
    calls: dict[str, dict[str, Any]] = {}
    for i, m in enumerate(row["messages"] or []):
        m["idx"] = i
        m["reasoning"], m["text"] = message_reasoning(m) if m["role"] == "assistant" else \
            (None, m.get("content") or "")
        for tc in m.get("tool_calls") or []:
            tc["parsed"] = _json(tc["function"]["arguments"], None)
            calls[tc["id"]] = tc
    for m in row["messages"] or []:
        if m["role"] == "tool" and m.get("tool_call_id") in calls:
            m["call"] = calls[m["tool_call_id"]]
    row["findings"] = group_findings(row["forensics"], row["messages"] or [])
    row["snapshots"] = _rows(con, """SELECT m.snapshot_id, m.weight, d.run_id, d.round::INTEGER AS round
                                     FROM manifests m LEFT JOIN datasets d USING (snapshot_id)
                                     WHERE m.trajectory_id = ? ORDER BY d.created_at, m.snapshot_id""",
                             [trajectory_id])
    row["siblings"] = _rows(con, """SELECT count(*) AS n, count(*) FILTER (WHERE verdict = 'pass') AS passed
                                    FROM trajectories WHERE task_id = ?""", [row["task_id"]])[0]
    return row


_EVIDENCE_PATH = re.compile(r"^([\w][\w./-]*): ")


def _turn_writing(path: str, messages: list[dict[str, Any]]) -> int | None:
    """The last assistant turn whose tool call names `path` as its argument `path` (the write that left it)."""
    for m in reversed(messages):
        for tc in m.get("tool_calls") or []:
            if isinstance(tc.get("parsed"), dict) and tc["parsed"].get("path") == path:
                return m["idx"]
    return None


def group_findings(findings: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Forensics findings grouped by reason code, each evidence with its channel and turn. A finding without a
    turn whose evidence names a file ("solution.py: calls sys.exit()") gets the turn of the tool call that wrote
    that file, marked as located (not stated by forensics)."""
    groups: dict[str, dict[str, Any]] = {}
    for f in findings:
        if not isinstance(f, dict):
            continue
        turn, located = f.get("turn"), False
        if turn is None and (m := _EVIDENCE_PATH.match(str(f.get("evidence", "")))):
            turn = _turn_writing(m.group(1), messages)
            located = turn is not None
        g = groups.setdefault(str(f.get("code")), {"code": str(f.get("code")), "evidence": [], "turns": []})
        g["evidence"].append({"channel": f.get("channel"), "evidence": f.get("evidence"), "turn": turn,
                           "located": located})
        if turn is not None and turn not in g["turns"]:
            g["turns"].append(turn)
    return list(groups.values())


# ----------------------------------------------------------------------------- a task
def task_page(con: duckdb.DuckDBPyConnection, task_id: str) -> dict[str, Any]:
    """Every episode of a task across runs, rounds and policies, and pass@k per (run, round, source, policy)."""
    eps = _rows(con, """SELECT trajectory_id, run_id, round::INTEGER AS round, source, policy, sample_index, suite,
                               split, verdict, hack_flags, reward, turns, n_tool_calls,
                               prompt_tokens + completion_tokens AS tokens, created_at
                        FROM trajectories WHERE task_id = ?
                        ORDER BY run_id, round, source = 'student', policy, sample_index""", [task_id])
    if not eps:
        raise ViewError(f"task {task_id!r} has no episodes in this lake: find it in the episode list (/episodes)",
                        404, "Unknown task")
    groups = _rows(con, """
        SELECT * FROM (SELECT run_id, round::INTEGER AS round, source, policy, count(*) AS n,
                              count(*) FILTER (WHERE verdict = 'pass') AS passed,
                              count(*) FILTER (WHERE verdict = 'hack') AS hacks,
                              count(*) FILTER (WHERE verdict = 'infra_error') AS infra_errors
                       FROM trajectories WHERE task_id = ? GROUP BY ALL)
        ORDER BY run_id, round, source = 'student', policy""",
                   [task_id])
    for g in groups:
        scored = g["n"] - g["infra_errors"]
        g["pass_at_1"] = pass_at_k(scored, g["passed"], 1)
        g["pass_at_k"] = pass_at_k(scored, g["passed"], scored)  # k = every scored sample of the group
    return {"task_id": task_id, "suite": eps[0]["suite"], "split": eps[0]["split"], "episodes": eps,
            "groups": groups}


# ----------------------------------------------------------------------------- a snapshot
def snapshot_page(con: duckdb.DuckDBPyConnection, snapshot_id: str) -> dict[str, Any]:
    """A snapshot's datasets row, its mix by source and suite (from the manifest), drops by reason (from the
    curation counts), and the filter that lists its candidates that were left out."""
    snap = _one(con, "SELECT * FROM datasets WHERE snapshot_id = ?", snapshot_id,
                f"snapshot {snapshot_id!r} is not in this lake's datasets table: pick one on a run's page",
                "Unknown snapshot")
    snap["counts"] = _json(snap.pop("counts_json"), {})
    snap["config"] = _json(snap.pop("config_json"), {})
    snap["mix"] = _rows(con, """SELECT source, suite, count(*) AS n, sum(weight) AS weight FROM manifests
                                WHERE snapshot_id = ? GROUP BY ALL ORDER BY source, suite""", [snapshot_id])
    snap["drops"] = sorted((snap["counts"].get("dropped_by_reason") or {}).items(), key=lambda kv: -kv[1])
    include_earlier = bool((snap["config"] or {}).get("include_earlier_rounds", True))
    op = "<=" if include_earlier else "="
    # The lake keeps counts per drop reason, not each row's reason: link the candidates that were not selected.
    # The link is a free WHERE the person sees and may edit, so it carries the id as text: snapshot ids are
    # partition-safe names (letters, digits, '.', '_', '-'), and any other id gets no link rather than an escape.
    snap["left_out_where"] = (f"round {op} {int(snap['round'])} AND trajectory_id NOT IN (SELECT trajectory_id "
                              f"FROM manifests WHERE snapshot_id = '{snapshot_id}')"
                              if re.fullmatch(r"[A-Za-z0-9._-]{1,200}", snapshot_id) else None)
    # A (source, verdict) pair whose left-out rows all share one reason links to exactly those rows.
    table = snap["counts"].get("table") or []
    reasons: dict[tuple[str, str], set[str]] = {}
    for c in table:
        if c.get("outcome") != "selected":
            reasons.setdefault((c.get("source"), c.get("verdict")), set()).add(c.get("outcome"))
    for c in table:
        c["exact_link"] = c.get("outcome") != "selected" and len(reasons.get((c.get("source"), c.get("verdict")),
                                                                             ())) == 1
    return snap
