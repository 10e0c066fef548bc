"""Benchmark: the first start of a Prefect server on a fresh PREFECT_HOME, with and without the migrated template.

flywheel's servers (shared and own, flows/localserver.py) start on a home that flows/prefect_db.py seeded with a copy
of a database Alembic migrated once per Prefect version; without it the server migrates an empty SQLite file on its
first start. Each round starts a command's own server (flows/own_server.py: uvicorn over Prefect's app) on two fresh
homes, `fresh` (no database, the baseline: the database is named in PREFECT_SERVER_DATABASE_CONNECTION_URL, which
turns seeding off) and `seeded` (the template copied in by the launch), alternating which goes first so
both see the same machine load, and times launch-to-first-answer of /health, seeding included. The template is built
before the first round (its one-time build is timed and reported apart). Prints a table; writes JSON (--out).

    .venv/bin/python benchmarks/server_start.py [--rounds 5] [--out /tmp/flywheel-bench-server-start.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flows import own_server, prefect_db


def start_once(seed: bool, work: Path) -> float:
    """Seconds from launch (seeding included) until the server answers, on a new home under `work`."""
    home = Path(tempfile.mkdtemp(prefix="home-", dir=work))
    os.environ["PREFECT_HOME"] = str(home)
    # the baseline names Prefect's default database outright, which flows/prefect_db.py never seeds
    url_var = "PREFECT_SERVER_DATABASE_CONNECTION_URL"
    os.environ.pop(url_var, None)
    if not seed:
        os.environ[url_var] = f"sqlite+aiosqlite:///{home}/prefect.db"
    t0 = time.monotonic()
    own_server.launch()  # seeds the home first (flows/prefect_db.py) unless the database is named
    try:
        own_server.wait(300)
        return time.monotonic() - t0
    finally:
        own_server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each starts one fresh and one seeded server")
    ap.add_argument("--out", default="/tmp/flywheel-bench-server-start.json", help="JSON written here")
    args = ap.parse_args()
    os.environ.pop("PREFECT_API_URL", None)
    t0 = time.monotonic()
    template = prefect_db.ensure_template()
    build_s = time.monotonic() - t0
    res: dict[str, list[float]] = {"fresh": [], "seeded": []}
    with tempfile.TemporaryDirectory(prefix="fw-bench-server-") as work:
        for r in range(args.rounds):
            for mode in (("fresh", "seeded") if r % 2 == 0 else ("seeded", "fresh")):
                res[mode].append(start_once(mode == "seeded", Path(work)))
                print(f"round {r + 1} {mode:>6} {res[mode][-1]:.1f} s", file=sys.stderr)
    med = {m: statistics.median(v) for m, v in res.items()}
    print(f"\ntemplate {template} ({template.stat().st_size / 1e6:.1f} MB): "
          f"{'built in ' + format(build_s, '.1f') + ' s' if build_s > 1 else 'already built'}")
    print(f"first start of a server on a fresh home, median of {args.rounds} rounds (seconds); load average at end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'mode':<10}{'median':>8}{'min':>8}{'max':>8}")
    for m, v in res.items():
        print(f"{m:<10}{med[m]:>8.1f}{min(v):>8.1f}{max(v):>8.1f}")
    print(f"fresh / seeded: {med['fresh'] / med['seeded']:.2f}x")
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "template_build_s": build_s, "median_s": med,
                                          "ratio_fresh_over_seeded": med["fresh"] / med["seeded"], "runs": res,
                                          "load_average_end": os.getloadavg()}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
