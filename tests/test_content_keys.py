"""scripts/content_keys.py compares a suite here with the same suite at a commit, rendered
under that commit's code in a worktree: against HEAD every split equals itself and nothing
else (the shipped suites are disjoint by content), and the worktree is gone afterwards."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]


def test_a_suite_against_itself_at_head_overlaps_only_split_by_split(tmp_path: Path) -> None:
    ck = load_script("scripts/content_keys.py")
    trees = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    config = "configs/default.toml"
    now = ck.keys(str(REPO / config))
    at_head = ck.keys_at("HEAD", config)
    assert set(now) == set(at_head) == {"train", "validation", "heldout", "ood"}
    counts = ck.overlap(now, at_head)
    for split, row in counts.items():
        assert row[split] == len(now[split]) > 0, split
        assert all(n == 0 for other, n in row.items() if other != split), (split, row)
    assert len(now["heldout"]) == 300  # each held-out content once
    after = subprocess.run(
        ["git", "-C", str(REPO), "worktree", "list"], capture_output=True, text=True, check=True
    ).stdout
    assert after == trees
