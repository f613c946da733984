"""The run report's per-version off-policy summary, on numbers worked by hand."""

from __future__ import annotations

from datetime import UTC

import pytest

from dart_ray.reporting.report import off_policy_by_version


def test_off_policy_metrics_are_averaged_per_version() -> None:
    # version 1 had two steps (clip 0.1 and 0.3 -> 0.2); version 2 one step, and only it
    # measured the on-policy gap; keys a step did not report are left out, not zero
    history = [
        {"version": 1, "clip_frac": 0.1, "is_capped_frac": 0.0, "loss": 5.0},
        {"version": 1, "clip_frac": 0.3, "is_capped_frac": 0.5, "sample_version_min": 0},
        {"version": 1, "sample_version_min": 1, "sample_version_max": 1},
        {"version": 2, "clip_frac": 0.0, "onpolicy_logp_diff_abs": 2e-6},
    ]
    rows = off_policy_by_version(history)
    assert rows == [
        {
            "version": 1.0,
            "clip_frac": pytest.approx(0.2),
            "is_capped_frac": 0.25,
            "sample_version_min": 0.0,  # the oldest sample of the version's steps
            "sample_version_max": 1.0,
        },
        {"version": 2.0, "clip_frac": 0.0, "onpolicy_logp_diff_abs": 2e-6},
    ]


def test_wilson_and_delta_intervals_on_hand_numbers() -> None:
    from dart_ray.reporting.plots import delta_interval, wilson

    # 0 of 10: centre (0 + 1.9208/10) / 1.38415 = 0.13877, half-width
    # 1.96 * sqrt(0 + 3.8415/400) / 1.38415 = 0.13877 -> [0, 0.2775]
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    # 5 of 10: symmetric around 0.5, half-width 1.96 * sqrt(0.025 + 0.0096) / 1.38415 = 0.2634
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    # 30% -> 50% on 100 tasks: se = sqrt((0.21 + 0.25) / 100) = 0.067823; +-1.96 se = 0.13293
    assert delta_interval(0.3, 0.5, 100) == pytest.approx((0.0671, 0.3329), abs=1e-4)


def test_bands_pool_versions() -> None:
    from dart_ray.reporting.plots import Point, bands

    # width 2: versions 0-1 -> 3 of 8, versions 2-3 -> 1 of 2 (version 3 has no episodes)
    got = bands({0: (1, 4), 1: (2, 4), 2: (1, 2)}, 2)
    assert got == [Point(0.5, 3, 8), Point(2.5, 1, 2)]


def test_the_report_line_and_figure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from PIL import Image

    from dart_ray.reporting.figures import draw_curve
    from dart_ray.reporting.report import RunReport, heldout_line

    r = RunReport.empty("run-x")
    r.heldout_before, r.heldout_after, r.heldout_tasks, r.versions = 0.3, 0.5, 100, 40
    r.sampled = [[v, v // 4, 10] for v in range(40)]
    r.rewards = [0.5] * 40
    # +20.0 points, 95% CI +6.7 to +33.3 (the numbers above)
    assert heldout_line(r) == "30.0% -> 50.0% (+20.0 points, 95% CI +6.7 to +33.3; 100 tasks)"
    out = draw_curve(r, tmp_path / "curve.png")
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] >= 600


def test_utilisation_by_hand() -> None:
    from dart_ray.reporting.plots import utilisation

    # two sessions; bins [0, 10) and [10, 20): busy 10 + 5 of 20 session-seconds, then 5 of 20
    assert utilisation([(0, 10), (5, 15)], 2, 0, 20, 2) == [(5.0, 0.75), (15.0, 0.25)]
    # an interval is clipped to the window; one outside it counts for nothing
    assert utilisation([(-5, 3), (30, 40)], 1, 0, 10, 1) == [(5.0, 0.3)]
    assert utilisation([(0, 1)], 1, 5, 5, 3) == []  # an empty window


def test_the_system_figure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from datetime import datetime, timedelta

    from PIL import Image

    from dart_ray.reporting.figures import draw_system_figure
    from dart_ray.reporting.report import RunReport

    r = RunReport.empty("run-x")
    r.sessions = 2
    t0 = datetime(2026, 12, 4, 8, 0, 0)
    episodes = [
        (t0 + timedelta(seconds=s), t0 + timedelta(seconds=s + 20)) for s in range(0, 300, 10)
    ]
    start = t0.replace(tzinfo=UTC).timestamp()  # the log's clock is taken as UTC
    r.trainer_busy = [[start + s, start + s + 4] for s in range(30, 300, 15)]
    r.staleness = {"0": 40, "1": 25, "2": 3}
    r.sync_latency = [[v, 0.4 + 0.01 * v] for v in range(1, 19)]
    out = draw_system_figure(r, episodes, tmp_path / "system.png")
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[1] >= 600
    empty = draw_system_figure(RunReport.empty("run-y"), [], tmp_path / "empty.png")
    assert empty.stat().st_size > 0  # a run with nothing yet still gets its (empty) figure


def test_task_family_from_the_id() -> None:
    from dart_ray.reporting.families import task_family

    # MiniDesk: minidesk/<family>/t<tier>/<seed> -> the last part that is not an index
    assert task_family("minidesk/type-field/t2/17") == "type-field"
    assert task_family("minidesk/click-button/t1/0") == "click-button"
    # MiniWoB++: miniwob/<page>/<seed>, where a page's name may hold a digit
    assert task_family("miniwob/click-test-2/100000") == "click-test-2"
    assert task_family("miniwob/focus-text/3") == "focus-text"
    # a flat id: the part before the first '-' a digit follows
    assert task_family("type-field-12") == "type-field"
    assert task_family("task-0") == "task"
    # neither: the whole id
    assert task_family("click") == "click"
    assert task_family("7-up") == "7-up"  # no digit after its dash
    assert task_family("-3") == "-3"
    assert task_family("suite/12/34") == "suite"
    assert task_family("1/2") == "1/2"


def test_family_usage_sums_tasks_and_divides() -> None:
    from dart_ray.reporting.families import FamilyUsage, family_table, family_usage

    per_task = {
        "minidesk/type-field/t1/0": (16, 0, 16),  # never solved: every rollout dropped
        "minidesk/type-field/t1/1": (8, 0, 8),
        "minidesk/click-button/t1/0": (8, 6, 0),
        "osworld-uuid": (2, 1, 1),
    }
    rows = family_usage(per_task, {"osworld-uuid": "chrome"})
    assert rows == [
        FamilyUsage("type-field", 2, 24, 0, 24),
        FamilyUsage("click-button", 1, 8, 6, 0),
        FamilyUsage("chrome", 1, 2, 1, 1),
    ]
    # 8 rollouts for 6 trained rows: 1.33 each; nothing trained: no ratio
    assert rows[1].per_trained == pytest.approx(8 / 6)
    assert rows[0].per_trained is None
    assert FamilyUsage(**rows[2].to_json()) == rows[2]  # round-trips through report.json
    from rich.console import Console

    console = Console(width=120, record=True)
    console.print(family_table(rows))
    text = console.export_text()
    # all: 34 rollouts for 7 trained rows -> 4.86
    assert "type-field" in text and "4.86" in text and "1.33" in text


def test_the_seed_table_names_every_column_and_whole_task_ids_at_80_columns() -> None:
    """The run's "replay seeds" table (curation.replay_seeds): an OSWorld id is 36
    characters, and a console of 80 cut ids and lost the `again` header before."""
    from rich.console import Console

    from dart_ray.reporting.report import seed_table

    ids = ["bb5e4c0d-f964-439c-97b6-bdb9747de3f4", "5ac2891a-eacd-4954-b339-98abba077adb"]
    seeds = [
        {"task_id": ids[0], "reward": 1.0, "status": "OK", "seeded": True, "again": 2,
         "replays": 3, "rollouts": 12, "trained": 9},
        {"task_id": ids[1], "reward": 0.0, "status": "TRUNCATED", "seeded": False, "again": 0,
         "replays": 0, "rollouts": 4, "trained": 0},
    ]  # fmt: skip
    console = Console(width=80, record=True)
    console.print(seed_table(seeds))
    text = console.export_text()
    assert "1 of 2 succeeded; 1 tasks gave signal" in text
    for header in ("task", "seed", "again", "replays", "rollouts", "trained"):
        assert header in text
    task_cells = "".join(
        line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")
    )
    assert task_cells == "".join(ids)  # folded onto more lines where it must, never cut
    rows = [
        [c.strip() for c in line.split("│")[2:7]]
        for line in text.splitlines()
        if "1.00" in line or "0.00" in line
    ]
    assert rows == [["1.00", "2", "3", "12", "9"], ["0.00 (TRUNCATED)", "0", "0", "4", "0"]]
