"""`dart-ray experiment`: the spec, the statistics it fills, and one real experiment."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dart_ray.config import ConfigError
from dart_ray.run.experiment import ExperimentSpec, load_spec, run_experiment, summarise, table

ROOT = Path(__file__).resolve().parents[1]


def _spec(**kw: object) -> ExperimentSpec:
    return ExperimentSpec.model_validate(
        {"name": "x", "config": "configs/tiny-cpu.toml", "arms": {"rl": {}}, **kw}
    )


def test_every_shipped_experiment_loads_and_names_a_config_that_exists() -> None:
    files = sorted((ROOT / "configs" / "experiments").glob("*.toml"))
    assert {f.stem for f in files} >= {"default", "multi-step", "miniwob"}
    for f in files:
        spec = load_spec(f)
        assert (ROOT / spec.config).is_file(), f
        if f.stem in ("default", "multi-step", "miniwob"):  # the protocol's claims
            assert {"rl", "lr0", "rft", "sft"} <= spec.arms.keys(), f
            assert len(spec.seeds_of("rl")) >= 3, f
        else:  # a choice: it reads the validation split, never the held-out one
            assert spec.splits == ("validation",), f


def test_arms_change_what_their_name_says_and_their_own_overrides_come_last() -> None:
    spec = _spec(
        overrides=["run.eval_tasks=0"],
        arms={"rl": {}, "lr0": {}, "rft": {}, "noadm": {"base": "rl", "overrides": ["x.y=1"]}},
    )
    assert spec.run_overrides("lr0", 2, "r") == [
        "run.eval_tasks=0",
        "train.lr=0",
        "run.seed=2",
        "run.run_id=r",
    ]
    assert "algo.objective=rft" in spec.run_overrides("rft", 0, "r")
    assert spec.run_overrides("noadm", 0, "r")[1] == "x.y=1"


def test_a_bad_spec_is_refused_naming_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not built in"):
        _spec(arms={"mystery": {}})
    with pytest.raises(ValueError, match=r"sft\.minutes or an rl arm"):
        _spec(arms={"sft": {}})
    with pytest.raises(ValueError, match="unknown splits"):
        _spec(splits=["test"])
    bad = tmp_path / "e.toml"
    bad.write_text('name = "x"\n')
    with pytest.raises(ConfigError, match=r"e\.toml"):
        load_spec(bad)


def test_summarise_fills_the_contract_from_the_scores() -> None:
    # 4 tasks, warm start solves task a only; rl's two seeds solve a,b,c and a,b (+50, +25);
    # lr0 solves a (+0): rl's mean lift +37.5 points, rl - lr0 = +37.5
    tasks = ["a", "b", "c", "d"]
    before = {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0}

    def seed(s: int, solved: str) -> dict[str, object]:
        scores = {t: float(t in solved) for t in tasks}
        return {"seed": s, "versions": 10, "minutes": 8.0, "scores": {"heldout": scores}}

    result = {
        "name": "x",
        "config": "c.toml",
        "commit": "0123456789abcdef",
        "tasks": {"heldout": tasks},
        "before": {"heldout": before},
        "arms": {
            "rl": {"kind": "rl", "seeds": [seed(0, "abc"), seed(1, "ab")]},
            "lr0": {"kind": "lr0", "seeds": [seed(0, "a")]},
        },
    }
    # rl's runs started 100 and 300 rollouts and dropped 2 and 6 stale: 8 of 400, 2.0%;
    # lr0's run is from before the runs recorded it (no "started"): no share
    rl_runs = result["arms"]["rl"]["seeds"]  # type: ignore[index]
    for s, (started, stale) in zip(rl_runs, [(100, 2), (300, 6)], strict=True):
        s |= {"started": started, "dropped": {"stale": stale, "no_signal": 40}}
    summarise(result)
    rl, lr0 = result["arms"]["rl"], result["arms"]["lr0"]
    assert rl["mean_lift"] == pytest.approx(0.375)
    assert [s["before"] for s in rl["seeds"]] == [0.25, 0.25]
    assert [s["after"] for s in rl["seeds"]] == [0.75, 0.5]
    assert (rl["lift_min"], rl["lift_max"]) == (0.25, 0.5)
    assert rl["lift_ci95"][0] <= 0.375 <= rl["lift_ci95"][1]
    assert lr0["rl_minus_this"]["diff"] == pytest.approx(0.375)
    assert lr0["n_seeds"] == 1 and "rl_minus_this" not in rl
    assert rl["stale_frac"] == pytest.approx(0.02) and "stale_frac" not in lr0
    lines = table(result)
    assert any("rl" in ln and "+37.5" in ln and "2.0% stale" in ln for ln in lines)
    json.dumps(result)  # the contract is JSON


# with the learning runs it drives (`make test-learning`): 2 minutes that CI's 40 do not hold
@pytest.mark.slow
@pytest.mark.learning
@pytest.mark.timeout(1200)
def test_a_small_experiment_runs_every_kind_of_arm_and_writes_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rl, rft and sft on the tiny pipeline (one version each, 12 held-out tasks): each run is
    a real `dart-ray train` (or SFT), scored on the same tasks as the warm start, and the JSON
    holds the contract's fields."""
    monkeypatch.chdir(ROOT)
    spec = _spec(
        seeds=[0],
        overrides=["run.max_versions=1", "run.eval_tasks=0", f"run.root_dir={tmp_path}"],
        arms={"rl": {}, "rft": {}, "sft": {}},
        sft={"minutes": 0.05, "tasks": 8},
    )
    out = tmp_path / "x.json"
    result = run_experiment(spec, out)
    saved = json.loads(out.read_text())
    assert saved["commit"] and saved["heldout_tasks"] == 12 == len(saved["tasks"]["heldout"])
    for name in ("rl", "rft", "sft"):
        arm = saved["arms"][name]
        (run,) = arm["seeds"]
        assert {"seed", "before", "after", "versions", "minutes"} <= run.keys()
        assert len(arm["lift_ci95"]) == 2 and np.isfinite(arm["mean_lift"])
        assert Path(run["model"]).is_dir()
    assert saved["arms"]["rft"]["seeds"][0]["versions"] >= 1
    # where the rollouts went (issue 44: each run's stale share and the admission's idle time)
    rl = saved["arms"]["rl"]["seeds"][0]
    assert rl["started"] >= 1 and rl["admission_held_s"] >= 0
    assert 0 <= rl["dropped"].get("stale", 0) <= rl["started"]
    assert saved["arms"]["sft"]["seeds"][0]["sft_steps"] >= 1
    assert "rl_minus_this" in saved["arms"]["rft"]
    assert result["arms"]["rl"]["seeds"][0]["before"] == saved["arms"]["sft"]["seeds"][0]["before"]


def test_an_arm_from_another_warm_start_is_measured_from_its_own_before() -> None:
    # warm start A solves a; arm ws (from warm start B, which solves a and b) ends solving
    # a, b, c: its lift is +25 (from B's 50%), not +50 (from A's 25%); rl - ws = 50 - 25
    tasks = ["a", "b", "c", "d"]

    def run(solved: str) -> dict[str, object]:
        return {"seed": 0, "scores": {"validation": {t: float(t in solved) for t in tasks}}}

    result = {
        "name": "x",
        "config": "c.toml",
        "commit": "0" * 10,
        "warm_start": "A",
        "tasks": {"validation": tasks},
        "before": {"validation": {t: float(t == "a") for t in tasks}},
        "warm_starts": {"B": {"validation": {t: float(t in "ab") for t in tasks}}},
        "arms": {
            "rl": {"kind": "rl", "warm_start": "A", "seeds": [run("abc")]},
            "ws": {"kind": "rl", "warm_start": "B", "seeds": [run("abc")]},
        },
    }
    summarise(result)
    assert result["arms"]["rl"]["splits"]["validation"]["mean_lift"] == pytest.approx(0.5)
    ws = result["arms"]["ws"]["splits"]["validation"]
    assert ws["mean_lift"] == pytest.approx(0.25)
    assert ws["rl_minus_this"]["diff"] == pytest.approx(0.25)
