"""The judge's public surface: what tasks/, agents/, training/, curate/, flows/ and scripts import from the judge.

- verify(task, messages, ...) -> Outcome; VERIFIER_VERSIONS (verify.py: numeric, unit tests on the data or isolated
  path, LLM judge, Harbor, BFCL; every verdict fail-closed);
- VerifierError, VerifierUnavailable (errors.py: what crosses the judge's boundary; infra_error, retried);
- JudgeConfig (llm.py), RewardConfig (rewards.py): the judge's two configurations;
- extract_answer, numbers_match, ANSWER_RE (answers.py: the final answer in assistant text);
- inspect_episode, hack_flags, Finding, REASON_CODES, FORENSICS_VERSION (forensics.py: reward-hack evidence).
Inside the package: unittests.py (the data and isolated paths in fresh sandboxes), testsplit.py and testnames.py
(what a test sends into the sandbox), guest/ (plaindata.py, callserver.py, runner.py: the programs that run INSIDE
the judge's sandbox, shipped as source), constfold.py and provenance.py (static reading for forensics), the forensics_*.py channels (they share
through forensics_context.py's public names). Nothing outside the package imports a private name of it
(tests/test_imports.py). This module only names the surface; it runs nothing.
"""

from tasks.judge.answers import ANSWER_RE, extract_answer, numbers_match
from tasks.judge.errors import VerifierError, VerifierUnavailable
from tasks.judge.forensics import FORENSICS_VERSION, REASON_CODES, Finding, hack_flags, inspect_episode
from tasks.judge.llm import JudgeConfig
from tasks.judge.rewards import RewardConfig
from tasks.judge.verify import VERIFIER_VERSIONS, Outcome, verify

__all__ = ["ANSWER_RE", "FORENSICS_VERSION", "REASON_CODES", "VERIFIER_VERSIONS", "Finding", "JudgeConfig", "Outcome",
           "RewardConfig", "VerifierError", "VerifierUnavailable", "extract_answer", "hack_flags", "inspect_episode",
           "numbers_match", "verify"]
