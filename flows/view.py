"""`flywheel view`: a local, read-only web app over the lake (FastAPI + Jinja2 pages rendered on the server).

Pages (stable URLs, paste them into an issue):
  /                          runs of the lake
  /runs/RUN_ID               episodes per round and source, the rounds table, the report's plots, snapshots
  /episodes?...              the episode list: filters (run_id, round, source, policy, suite, split, verdict,
                             hack, task_id, where), sort, desc, page, per_page
  /episodes/TRAJECTORY_ID    one episode: conversation, tool calls and outputs, reasoning, verdict, forensics...
  /tasks/TASK_ID             every episode of a task, teacher vs student, pass@k per round
  /snapshots/SNAPSHOT_ID     a snapshot's mix by source and its drops by reason
Each request opens the lake afresh through warehouse.viewer.open_view (new files show up on reload) and closes
it. Bad input answers an error page with the status the ViewError carries; nothing answers a stack trace. The
app has no route that writes. This module holds the pages, not the queries (warehouse/viewer.py).
"""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup, escape
from starlette.exceptions import HTTPException as StarletteHTTPException

from warehouse import viewer
from warehouse.lakefs import LakeError
from warehouse.query import QueryError
from warehouse.viewer import EpisodeQuery, ViewError

log = logging.getLogger(__name__)
TEMPLATES = Path(__file__).with_name("view_templates")
FOLD_LINES = 24
FOLD_CHARS = 4000
CODE_KEYS = {"code": "python", "source": "python", "program": "python", "command": "bash", "cmd": "bash",
             "script": "bash", "sql": "sql", "query": "sql"}


class ViewServerError(Exception):
    """`flywheel view` cannot start: the port is taken or the host cannot be bound. The message names the fix."""


# ----------------------------------------------------------------------------- rendering helpers
def highlight(code: str, lang: str | None = None, filename: str | None = None) -> Markup:
    """Code as highlighted HTML (pygments), by language name or file name; plain escaped text if unknown."""
    from pygments import highlight as pyg
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import TextLexer, get_lexer_by_name, get_lexer_for_filename
    from pygments.util import ClassNotFound

    try:
        lexer = get_lexer_for_filename(filename) if filename else get_lexer_by_name(lang or "text")
    except ClassNotFound:
        lexer = TextLexer()
    return Markup(pyg(code, lexer, HtmlFormatter(nowrap=True)))


def _pygments_css() -> str:
    import re

    from pygments.formatters import HtmlFormatter

    return re.sub(r"\s*/\*.*?\*/", "", HtmlFormatter(style="friendly").get_style_defs(".code"))


def argument_blocks(name: str, parsed: Any, raw: str) -> list[dict[str, Any]]:
    """A tool call's arguments as blocks: code-like strings highlighted, the rest as pretty JSON."""
    if not isinstance(parsed, dict):
        return [{"label": "arguments (not a JSON object)", "html": escape(raw)}]
    blocks, rest = [], {}
    path = parsed.get("path") if isinstance(parsed.get("path"), str) else None
    for k, v in parsed.items():
        if isinstance(v, str) and (k in CODE_KEYS or (k == "content" and path) or "\n" in v):
            fname = path if k == "content" and path else None
            blocks.append({"label": k if not fname else f"{k} of {fname}",
                           "html": highlight(v, CODE_KEYS.get(k, "python" if name == "python" else "text"), fname),
                           "lines": v.count("\n") + 1})
        else:
            rest[k] = v
    if rest:
        blocks.insert(0, {"label": "arguments", "html": highlight(json.dumps(rest, indent=2, ensure_ascii=False),
                                                                  "json"), "lines": 1})
    return blocks


def fold(text: str | None) -> dict[str, Any]:
    """A long text as a head to show and the full text to fold away."""
    text = text or ""
    lines = text.split("\n")
    long = len(lines) > FOLD_LINES or len(text) > FOLD_CHARS
    head = "\n".join(lines[:FOLD_LINES // 2])[: FOLD_CHARS // 2] if long else text
    return {"long": long, "head": head, "full": text, "lines": len(lines), "chars": len(text)}


def pct(v: Any) -> str:
    return "–" if v is None else f"{100 * float(v):.1f}%"


def num(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.4g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def when(v: Any) -> str:
    return "–" if v is None else v.strftime("%Y-%m-%d %H:%M:%S") if hasattr(v, "strftime") else str(v)


def path_url(prefix: str, value: str) -> str:
    return f"{prefix}/{quote(str(value), safe='')}"


def episodes_url(**params: Any) -> str:
    clean = {k: v for k, v in params.items() if v not in (None, "", False)}
    return "/episodes" + (f"?{urlencode(clean)}" if clean else "")


def _env() -> Environment:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(["html"]),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters.update(pct=pct, num=num, when=when, fold=fold, highlight=highlight,
                       pretty=lambda v: json.dumps(v, indent=2, ensure_ascii=False, default=str))
    env.globals.update(episode_url=lambda t: path_url("/episodes", t), task_url=lambda t: path_url("/tasks", t),
                       run_url=lambda r: path_url("/runs", r), snapshot_url=lambda s: path_url("/snapshots", s),
                       episodes_url=episodes_url, argument_blocks=argument_blocks, pygments_css=_pygments_css())
    return env


# ----------------------------------------------------------------------------- the app
def create_app(root: str) -> FastAPI:
    """The viewer's app over one lake root (checked here: an unknown root fails before the server starts)."""
    viewer.check_root(root)
    env = _env()
    app = FastAPI(title="flywheel view", docs_url=None, redoc_url=None, openapi_url=None)

    def render(name: str, status: int = 200, **ctx: Any) -> HTMLResponse:
        html = env.get_template(name).render(root=root, **ctx)
        return HTMLResponse(html, status_code=status)

    def error_page(status: int, title: str, message: str) -> HTMLResponse:
        return render("error.html", status=status, title=title, message=message)

    def with_lake(fn: Callable[[Any], HTMLResponse]) -> HTMLResponse:
        try:
            con = viewer.open_view(root)
        except (LakeError, QueryError) as e:
            raise ViewError(f"the lake under {root} cannot be read: {e}", 500, "Lake unreadable") from e
        try:
            return fn(con)
        except ViewError:
            raise
        except Exception as e:  # a bug: one log entry with the trace, a page without it
            log.error("flywheel view: internal error", exc_info=e)
            return error_page(500, "Internal error", f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]} "
                                                     "(the server log has the details)")
        finally:
            con.close()

    @app.exception_handler(ViewError)
    def _view_error(_req: Request, e: ViewError) -> HTMLResponse:
        return error_page(e.status, e.title, str(e))

    @app.exception_handler(StarletteHTTPException)
    def _http_error(req: Request, e: StarletteHTTPException) -> HTMLResponse:
        if e.status_code == 404:
            return error_page(404, "Not found", f"there is no page at {req.url.path}: start from the runs page (/)")
        return error_page(e.status_code, "Error", str(e.detail))

    @app.exception_handler(RequestValidationError)
    def _bad_params(_req: Request, e: RequestValidationError) -> HTMLResponse:
        msgs = "; ".join(f"{'.'.join(str(p) for p in err['loc'][1:])}: {err['msg']}" for err in e.errors())
        return error_page(400, "Bad request", f"bad query parameter ({msgs})")

    @app.exception_handler(Exception)
    def _crash(_req: Request, e: Exception) -> HTMLResponse:
        return error_page(500, "Internal error", f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]} "
                                                 "(the server log has the details)")

    @app.get("/", response_class=HTMLResponse)
    def index() -> HTMLResponse:
        return with_lake(lambda con: render("index.html", summary=viewer.lake_summary(con), runs=viewer.runs(con)))

    @app.get("/runs/{run_id}", response_class=HTMLResponse)
    def run_page(run_id: str) -> HTMLResponse:
        return with_lake(lambda con: render("run.html", run=viewer.run_rounds(con, run_id),
                                          plots=viewer.report_plots(root, run_id)))

    @app.get("/runs/{run_id}/report/{name}")
    def report_plot(run_id: str, name: str) -> Response:
        folder = viewer.report_folder(root, run_id)
        if folder is None or name not in viewer.report_plots(root, run_id):
            raise ViewError(f"run {run_id!r} has no report plot {name!r}", 404, "Unknown plot")
        return FileResponse(folder / name, media_type="image/png")

    @app.get("/episodes", response_class=HTMLResponse)
    def episodes(run_id: str = "", round: str = "", source: str = "", policy: str = "", suite: str = "",
                 split: str = "", verdict: str = "", task_id: str = "", hack: str = "", where: str = "",
                 sort: str = "created_at", desc: int = 1, page: int = 1, per_page: int = 50) -> HTMLResponse:
        filters = {"run_id": run_id, "round": round, "source": source, "policy": policy, "suite": suite,
                   "split": split, "verdict": verdict, "task_id": task_id}
        q = EpisodeQuery(filters=filters, hack=hack, where=where, sort=sort, desc=bool(desc),
                         page=page, per_page=per_page)
        params = {**q.filters, "hack": q.hack, "where": q.where, "sort": q.sort, "desc": int(q.desc),
                  "per_page": q.per_page}

        def answer(con: Any) -> HTMLResponse:
            try:
                result = viewer.episode_list(con, q)
            except ViewError as e:
                return _page_episodes(con, q, params, None, str(e))
            return _page_episodes(con, q, params, result, None)

        return with_lake(answer)

    def _page_episodes(con: Any, q: EpisodeQuery, params: dict[str, Any], result: dict[str, Any] | None,
                       error: str | None) -> HTMLResponse:
        return render("episodes.html", status=400 if error else 200, q=q, params=params, result=result, error=error,
                    choices=viewer.filter_choices(con, root), columns=viewer.LIST_COLUMNS, sortable=viewer.SORTABLE,
                    page_sizes=viewer.PAGE_SIZES)

    @app.get("/episodes/{trajectory_id}", response_class=HTMLResponse)
    def episode_page(trajectory_id: str) -> HTMLResponse:
        return with_lake(lambda con: render("episode.html", ep=viewer.episode(con, trajectory_id)))

    @app.get("/tasks/{task_id:path}", response_class=HTMLResponse)
    def task_page(task_id: str) -> HTMLResponse:
        return with_lake(lambda con: render("task.html", task=viewer.task_page(con, task_id)))

    @app.get("/snapshots/{snapshot_id}", response_class=HTMLResponse)
    def snapshot_page(snapshot_id: str) -> HTMLResponse:
        return with_lake(lambda con: render("snapshot.html", snap=viewer.snapshot_page(con, snapshot_id)))

    return app


def serve(root: str, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the viewer until interrupted. Raises ViewServerError when the address cannot be bound."""
    import uvicorn

    app = create_app(root)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ViewServerError(f"cannot listen on {host}:{port} ({e.strerror}); pass another --port "
                                  "or stop what holds it") from e
    print(f"flywheel view: http://{'[' + host + ']' if ':' in host else host}:{port}/  (lake {root}; Ctrl-C stops)",
          flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
