"""Every results file a doc cites is committed (issue 44), but for the ones docs/BENCHMARKS.md
opens by listing as not re-measured yet: the list may only shrink, and a file committed must
leave it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_YET = {
    "decoupling-scale0.02",
}
"""Results of sections older than issue 44, whose files were git-ignored then."""


def test_every_results_file_a_doc_cites_is_committed_or_listed_as_not_yet() -> None:
    cited = {
        (doc.name, m)
        for doc in DOCS
        for m in re.findall(r"benchmarks/results/[\w./-]+\.(?:json|png)", doc.read_text())
    }
    missing = sorted((doc, c) for doc, c in cited if not (REPO / c).is_file())
    unlisted = [(doc, c) for doc, c in missing if Path(c).stem not in NOT_YET]
    assert not unlisted, f"cited but not committed: {unlisted}"
    opening = (REPO / "docs" / "BENCHMARKS.md").read_text().split("\n## ", 1)[0]
    for name in NOT_YET:
        assert f"`{name}`" in opening, f"{name} is not in BENCHMARKS.md's list of files to measure"
        assert not (RESULTS / f"{name}.json").is_file(), (
            f"{name}.json is committed now: take it off NOT_YET and BENCHMARKS.md's list"
        )
