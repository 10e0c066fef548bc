"""Benchmark: start-up cost of CLI commands, per Prefect server arrangement, side by side in one process.

Each command runs through the installed `flywheel` console script with no PREFECT_API_URL, under three
arrangements, alternating in rounds so all see the same machine load:
- `prefect`: Prefect's own temporary server per command (FLYWHEEL_LOCAL_SERVER=0: the behaviour before issue 22,
  the baseline);
- `own`: flywheel's temporary server per command (FLYWHEEL_LOCAL_SERVER=own: started in parallel with the
  command's checks and imports, dies with the command, leases on disk);
- `shared`: the shared local server, started detached by the first command that needs it and reused by every
  later one, with the command in-process (FLYWHEEL_WARM=0); that first use is reported once, separately. The
  shared server's own CPU during a command (from /proc, it is not the command's child) is `server_cpu_s`;
- `warm` (the default): the shared server, and `generate` forked from the warm starter (flows/warm.py) that a
  first in-process generate left; the forked child's CPU (its sandboxes included; sampled from /proc every 20 ms,
  it is not the command's child) is added to the command's `cpu_s`. Other commands run as with `shared`.
All use one PREFECT_HOME whose database is migrated by a Prefect-mode run first. Reported per command: wall seconds,
CPU seconds of the command and its children (the server included when it is the command's own), and for `generate`
the seconds from launch to its first episode on disk (first Parquet file in the lake). Writes JSON (--out).

    .venv/bin/python benchmarks/startup.py [--rounds 2] [--modes prefect,own,shared,warm] [--commands all|generate]
        [--out /tmp/flywheel-bench-startup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLYWHEEL = str(Path(sys.executable).with_name("flywheel"))
MODES = ("prefect", "own", "shared", "warm")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _server_cpu(home: str) -> float | None:
    """CPU seconds the shared server recorded in PREFECT_HOME has used so far, None when none runs."""
    try:
        pid = json.loads((Path(home) / "flywheel-server.json").read_text())["pid"]
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, KeyError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _starters(home: str) -> list[int]:
    """pids of the ready warm starters of PREFECT_HOME."""
    out = []
    for f in (Path(home) / "flywheel-warm").glob("*.json"):
        try:
            st = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if st.get("ready"):
            out.append(int(st["pid"]))
    return out


def _forked_cpu(starters: list[int], seen: dict[int, float]) -> None:
    """Record in seen the CPU (own + reaped children) of each live child of the starters."""
    tck = os.sysconf("SC_CLK_TCK")
    for s in starters:
        for t in Path(f"/proc/{s}/task").glob("*"):
            try:
                kids = (t / "children").read_text().split()
            except OSError:
                continue
            for k in kids:
                try:
                    f = Path(f"/proc/{k}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                seen[int(k)] = max(seen.get(int(k), 0.0), sum(int(x) for x in f[11:15]) / tck)


def run_once(argv: list[str], env: dict, lake: Path | None) -> dict:
    """Run one command; wall, CPU and (with a lake) seconds to the first Parquet file under it."""
    first: list[float] = []
    forked: dict[int, float] = {}
    srv0 = _server_cpu(env["PREFECT_HOME"]) if env.get("FLYWHEEL_LOCAL_SERVER") == "shared" else None
    starters = _starters(env["PREFECT_HOME"]) if env.get("FLYWHEEL_WARM") != "0" else []
    cpu0, t0 = _children_cpu(), time.monotonic()
    p = subprocess.Popen([FLYWHEEL, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def watch() -> None:
        while p.poll() is None:
            if not first and lake is not None and lake.is_dir() and next(lake.rglob("*.parquet"), None):
                first.append(time.monotonic() - t0)
            if starters:
                _forked_cpu(starters, forked)
            elif first:
                return
            time.sleep(0.02)

    w = threading.Thread(target=watch, daemon=True)
    w.start()
    _, err = p.communicate(timeout=900)
    wall = time.monotonic() - t0
    w.join()
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({p.returncode}): {err[-2000:]}")
    srv1 = _server_cpu(env["PREFECT_HOME"]) if srv0 is not None else None
    client = _children_cpu() - cpu0
    return {"wall_s": wall, "cpu_s": client + sum(forked.values()), "first_episode_s": first[0] if first else None,
            "server_cpu_s": None if srv1 is None else srv1 - srv0, "forked": bool(forked), "client_cpu_s": client}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="measurements per arrangement and command, alternating")
    ap.add_argument("--out", default="/tmp/flywheel-bench-startup.json")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    ap.add_argument("--commands", default="all", help="all, or `generate` for the first-episode comparison only")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        raise SystemExit(f"--modes {args.modes!r}: choose from {', '.join(MODES)}")

    work = Path(tempfile.mkdtemp(prefix="fw-startup-"))
    base = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    base.update(PREFECT_HOME=str(work / "prefect-home"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",
                PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    envs = {"prefect": {**base, "FLYWHEEL_LOCAL_SERVER": "0"}, "own": {**base, "FLYWHEEL_LOCAL_SERVER": "own"},
            "shared": {**base, "FLYWHEEL_LOCAL_SERVER": "shared", "FLYWHEEL_WARM": "0"},
            "warm": {**base, "FLYWHEEL_LOCAL_SERVER": "shared"}}
    lake0 = work / "lake0"
    gen = ["generate", "--n-tasks", "1", "--samples", "1", "--backend", "local"]
    run_once([*gen, "--out", str(lake0)], envs["prefect"], None)  # warm-up: migrates the database, fills caches
    first_use = run_once([*gen, "--out", str(work / "lake-first")], envs["shared"], work / "lake-first")
    if "warm" in modes:  # an in-process generate that leaves the warm starter; wait until it listens
        run_once([*gen, "--out", str(work / "lake-warm-up")], envs["warm"], None)
        deadline = time.monotonic() + 300
        while not _starters(base["PREFECT_HOME"]):
            if time.monotonic() > deadline:
                raise SystemExit("no warm starter came up; see PREFECT_HOME/flywheel-warm.log")
            time.sleep(0.2)
    commands = {"generate --n-tasks 1": gen, "stats": ["stats", "--root", str(lake0)],
                "sql": ["sql", "SELECT count(*) FROM trajectories", "--root", str(lake0)],
                "tasks list": ["tasks", "list"]}
    if args.commands == "generate":
        commands = {"generate --n-tasks 1": gen}
    res: dict[str, dict[str, list[dict]]] = {c: {m: [] for m in modes} for c in commands}
    n = 0
    try:
        for r in range(args.rounds):
            for mode in modes:
                for name, argv in commands.items():
                    lake = None
                    if argv is gen:
                        n += 1
                        lake = work / f"lake-{n}"
                        argv = [*gen, "--out", str(lake)]
                    res[name][mode].append(run_once(argv, envs[mode], lake))
                    print(f"round {r + 1} {mode:>7} {name:<20} {res[name][mode][-1]}", file=sys.stderr)
                    Path(args.out).write_text(json.dumps({"partial": True, "first_use_shared": first_use,
                                                          "runs": res}, indent=1))  # kept if the run is cut
    finally:
        subprocess.run([FLYWHEEL, "server", "stop"], env=base, capture_output=True)

    def med(rows: list[dict], key: str) -> float | None:
        vals = [x[key] for x in rows if x[key] is not None]
        return statistics.median(vals) if vals else None

    def f(v: float | None) -> str:
        return "-" if v is None else f"{v:6.1f}"

    print(f"\nshared server, first use (starts it): wall {first_use['wall_s']:.1f} s, first episode "
          f"{first_use['first_episode_s'] or float('nan'):.1f} s, CPU of the command {first_use['cpu_s']:.1f} s")
    print(f"median of {args.rounds} rounds; seconds. load average at end: {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    def ratio(vals: dict, a: str, b: str) -> float | None:
        return vals[a] / vals[b] if vals.get(a) and vals.get(b) else None

    ratios = [(a, b) for a, b in (("prefect", "shared"), ("shared", "warm")) if a in modes and b in modes]
    print(f"{'command':<22}{'metric':<16}" + "".join(f"{m:>10}" for m in modes)
          + "".join(f"{a + '/' + b:>16}" for a, b in ratios))
    summary: dict = {}
    for name in commands:
        for key in ("wall_s", "cpu_s", "client_cpu_s", "server_cpu_s", "first_episode_s"):
            vals = {m: med(res[name][m], key) for m in modes}
            if all(v is None for v in vals.values()):
                continue
            rs = {f"ratio_{a}_over_{b}": ratio(vals, a, b) for a, b in ratios}
            summary.setdefault(name, {})[key] = {**vals, **rs}
            print(f"{name:<22}{key:<16}" + "".join(f"{f(vals[m]):>10}" for m in modes)
                  + "".join(f"{'-' if r is None else f'{r:.2f}x':>16}" for r in rs.values()))
    if "warm" in modes:
        warm_runs = [x for c in commands if c.startswith("generate") for x in res[c]["warm"]]
        print(f"warm generates forked from the starter: {sum(x['forked'] for x in warm_runs)} of {len(warm_runs)}")
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "first_use_shared": first_use,
                                          "load_average_end": os.getloadavg(), "summary": summary, "runs": res}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
