"""The Prefect flows and the CLI. A process started by `flywheel serve` (a flow run, in a session of its own) finds
FLYWHEEL_DIE_WITH=PID-STARTTIME of `serve` in its environment and exits when `serve` is gone
(flows/localserver.py's die_with_parent_command); nothing else happens on import."""

import os as _os

if _os.environ.get("FLYWHEEL_DIE_WITH"):
    from flows.localserver import die_with_parent_command as _die_with

    _die_with(_os.environ["FLYWHEEL_DIE_WITH"])
