"""The docs' generated parts: the guide's cost of every paper table is the runner's estimate, written by `make readme`
(scripts/update_readme.py), never typed by hand."""

from __future__ import annotations

import pytest
from conftest import REPO, load_script


def test_the_cost_line_is_written_between_its_markers_only(tmp_path):
    update = load_script("update_readme")
    page = tmp_path / "guide.md"
    page.write_text("# x\nThe set: <!-- cost:begin -->1 CPU-hour<!-- cost:end -->, said once.\n<!-- cost:end -->\n")
    assert update.write_cost(page, "78.6 CPU-hours, 39.42 h wall")
    assert page.read_text() == ("# x\nThe set: <!-- cost:begin -->78.6 CPU-hours, 39.42 h wall<!-- cost:end -->, "
                                "said once.\n<!-- cost:end -->\n")
    page.write_text("no markers\n")
    assert not update.write_cost(page, "2 CPU-hours") and page.read_text() == "no markers\n"


@pytest.mark.slow  # the runner's estimate over every kept run (about 10 s)
def test_the_guide_states_the_estimate_of_the_whole_set():
    update = load_script("update_readme")
    cost = update.whole_set_cost(REPO)
    assert cost is not None and "CPU-hours" in cost and " h wall with 2 job(s)" in cost, cost
    marked = update.COST.search((REPO / "docs" / "guide.md").read_text())
    assert marked is not None and marked[0] == f"<!-- cost:begin -->{cost}<!-- cost:end -->", "run make readme"
