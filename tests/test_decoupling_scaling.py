"""The scaling benchmark's summary from results already measured (`--reuse`): a size is taken
from a file only where that file measured every mode at the same minutes and scale."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def test_measured_sizes_are_reused_and_drawn_without_running_again(
    tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    scaling = load_script("benchmarks/decoupling_scaling.py")
    ran: list[list[str]] = []
    monkeypatch.setattr(scaling.decoupling, "main", lambda argv: ran.append(argv) or 0)
    out = tmp_path / "scaling.json"
    files = [RESULTS / "decoupling-32.json", RESULTS / "decoupling.json"]  # 32 and 64 sessions
    argv = ["--sizes", "32,64", "--minutes", "5", "--out", str(out), "--reuse", *map(str, files)]
    assert scaling.main(argv) == 0
    assert ran == []  # both sizes came from their files
    summary = json.loads(out.read_text())
    for n, f in (("32", files[0]), ("64", files[1])):
        size, measured = summary["sizes"][n], json.loads(f.read_text())
        assert size["file"] == str(f.relative_to(REPO)) and size["date"] == measured["date"]
        assert size["samples_per_hour_ratio"] == measured["samples_per_hour_ratio"]
    assert Path(summary["figure"]).is_file()

    # another --minutes: the files do not answer for it, so the size is measured again
    monkeypatch.setattr(scaling.decoupling, "main", lambda argv: ran.append(argv) or 1 / 0)
    with pytest.raises(ZeroDivisionError):  # the stand-in for a measurement stops it there
        scaling.main(
            ["--sizes", "32", "--minutes", "4", "--out", str(out), "--reuse", str(files[0])]
        )
    assert ran and ran[0][ran[0].index("--sessions") + 1] == "32"
