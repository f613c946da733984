"""Every results file a doc cites is committed (issue 44): a number in the docs can be checked
against the JSON it came from."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_results_file_a_doc_cites_is_committed() -> None:
    cited = {
        (doc.name, m)
        for doc in DOCS
        for m in re.findall(r"benchmarks/results/[\w./-]+\.(?:json|png)", doc.read_text())
    }
    assert cited, "no doc cites a results file: the pattern no longer matches the docs"
    missing = sorted((doc, c) for doc, c in cited if not (REPO / c).is_file())
    assert not missing, f"cited but not committed: {missing}"
