"""The judge's error types, typed by the boundary they cross: what a caller of the judge (the episode loop, the
audits, `flywheel verify`, the Harbor and BFCL verifiers) may catch.

- VerifierUnavailable crosses into the loop: the judge cannot judge now (no sandbox backend, the sandbox
  infrastructure failed); the episode's verdict is infra_error and it is retried, never scored 0. flows/cli.py
  knows it (one line, exit 2).
- VerifierError is their base, raised as such only when the code itself is wrong (a verifier kind the spec's
  Literal forbids reached verify()).
Errors that never leave the judge's sandbox (plaindata.NotPlainData, the call server's failures, the solution's
exceptions as SolutionRaised) live in the in-sandbox programs that raise them, and testsplit's _NoSplit stays a
private signal of the data path. This module defines no behaviour.
"""


class VerifierError(Exception):
    """Base of verifier errors that are not the episode's fault."""


class VerifierUnavailable(VerifierError):
    """The verifier cannot judge now (no sandbox backend, sandbox infrastructure failed): infra_error, retry."""
