"""The order `make test` hands files to its xdist workers (tests/conftest.py LONGEST_FILES_FIRST): the listed files
first, in the list's order, every other test in its collected place after them; and the Makefile keeps xdist from
re-sorting them by test count, which would undo it."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import LONGEST_FILES_FIRST, ROOT, pytest_collection_modifyitems


def test_every_listed_file_exists_once():
    assert len(set(LONGEST_FILES_FIRST)) == len(LONGEST_FILES_FIRST)
    assert [f for f in LONGEST_FILES_FIRST if not (ROOT / f).is_file()] == []


def test_listed_files_go_first_in_list_order_and_the_rest_keep_theirs():
    first, second = LONGEST_FILES_FIRST[:2]
    ids = ["tests/a/test_x.py::t1", f"{second}::t1", "tests/a/test_x.py::t2", f"{first}::t2", "tests/b/test_y.py::t",
           f"{first}::t1", f"{second}::t2"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    pytest_collection_modifyitems(None, None, items)
    assert [i.nodeid for i in items] == [f"{first}::t2", f"{first}::t1", f"{second}::t1", f"{second}::t2",
                                         "tests/a/test_x.py::t1", "tests/a/test_x.py::t2", "tests/b/test_y.py::t"]


def test_make_test_keeps_the_collected_order():
    xdist = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith("XDIST ="))
    assert "--dist loadfile" in xdist and "--no-loadscope-reorder" in xdist
