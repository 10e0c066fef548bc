"""The viewer reads an assistant message's reasoning with the conversation codec (warehouse.chat): an episode page
renders as it did with the viewer's own <think> reader for every case the codec reads (one opening block, with or
without text after it, an empty block, no block), and now also shows the reasoning the record keeps in its own
field. A small lake of hand-written rows, served in-process (FastAPI's test client); no sandbox, no server."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from flows.view import create_app
from warehouse import viewer
from warehouse.lake import write_trajectories
from warehouse.record import Message, Trajectory

_BEFORE_RE = re.compile(r"<think>(.*?)</think>\s*", re.DOTALL)


def _before(message: dict) -> tuple[str | None, str]:
    """The viewer's own reader before it used the codec (warehouse/viewer.py at bb36c89), for the comparison."""
    content = message.get("content")
    if not content or "<think>" not in content:
        return None, content or ""
    found = _BEFORE_RE.findall(content)
    if not found:
        return None, content
    return "\n\n".join(s.strip() for s in found), _BEFORE_RE.sub("", content).strip()


CODEC_CASES = {  # what a model writes that the codec reads: an opening <think> block, or none
    "block-then-answer": "<think>\nadd 2 and 3\n</think>\n\nAnswer: 5",
    "indented-block": "  <think>x</think>Answer: 5",
    "block-only": "<think>\nonly thoughts\n</think>",
    "empty-block": "<think>\n\n</think>\n\nAnswer: 5",
    "no-block": "Answer: 5\n",
    "no-content": None,
}


def _row(tid: str, assistant: Message) -> Trajectory:
    msgs = [Message(role="user", content="What is 2 + 3?"), assistant]
    return Trajectory(trajectory_id=tid, run_id="view-reasoning", source="student", policy="p", task_id="t1",
                      suite="arithmetic", difficulty=1, split="heldout", task_version="1", verifier="v",
                      verifier_version="1", messages=msgs, verdict="pass", reward=1.0, success=True)


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lake"))
    rows = [_row(f"case-{name}", Message(role="assistant", content=content)) for name, content in CODEC_CASES.items()]
    rows.append(_row("stored-field", Message(role="assistant", content="Answer: 5", reasoning="kept apart")))
    write_trajectories(root, rows)
    return root


@pytest.mark.parametrize("name", sorted(CODEC_CASES))
def test_codec_cases_read_as_before(name):
    m = {"role": "assistant", "content": CODEC_CASES[name], "reasoning": None}
    now, before = viewer.message_reasoning(m), _before(m)
    assert now[1] == before[1] and (now[0] or None) == (before[0] or None)


@pytest.mark.parametrize("name", sorted(CODEC_CASES))
def test_episode_page_renders_as_before(lake, monkeypatch, name):
    client = TestClient(create_app(lake))
    now = client.get(f"/episodes/case-{name}")
    monkeypatch.setattr(viewer, "message_reasoning", _before)
    before = client.get(f"/episodes/case-{name}")
    assert now.status_code == before.status_code == 200
    assert now.text == before.text
    if name == "block-then-answer":
        assert "add 2 and 3" in now.text and "reasoning</summary>" in now.text


def test_reasoning_kept_in_the_record_field_is_shown(lake):
    page = TestClient(create_app(lake)).get("/episodes/stored-field").text
    assert "reasoning</summary>" in page and "kept apart" in page and "Answer: 5" in page
