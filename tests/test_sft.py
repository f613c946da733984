"""`dart-ray sft`'s demonstrations: the prompt a rollout would build, the oracle's answer."""

from __future__ import annotations

from pathlib import Path

from dart_ray.config import EnvConfig
from dart_ray.envs.minidesk.generate import make_task
from dart_ray.models.loading import PolicyProcessor
from dart_ray.records import ActionKind
from dart_ray.uitars.actions import CoordinateMap, parse_response
from dart_ray.warmstart.sft import demonstrations

TINY = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-sft"


def test_a_demonstration_names_its_target_and_stops_at_the_commit() -> None:
    processor = PolicyProcessor.from_dir(TINY)
    task = make_task("click-button", 2, 3)
    demos = list(demonstrations([task], processor, EnvConfig()))
    assert len(demos) == 1  # the click commits: no answer is taught for a finished episode
    text = processor.decode(demos[0].response_ids)
    label = task.instruction.split("'")[1]
    assert text.startswith(f"Thought: I click the '{label}' button.\nAction: click(")
    coords = CoordinateMap.for_screen(320, 240, processor.min_pixels, processor.max_pixels)
    assert parse_response(text, coords).action.kind is ActionKind.CLICK
    assert demos[0].response_ids[-1] == processor.eos_id


def test_multi_step_demonstrations_carry_the_history() -> None:
    processor = PolicyProcessor.from_dir(TINY)
    task = make_task("toggle-checkbox", 1, 0)
    demos = list(demonstrations([task], processor, EnvConfig()))
    assert len(demos) == 2  # tick the box, then commit
    first = processor.decode(demos[0].response_ids)
    assert "checkbox" in first
    assert len(demos[1].prompt_ids) > len(demos[0].prompt_ids)  # the first answer is in it


def test_save_every_writes_the_snapshots_of_one_run(tmp_path: Path) -> None:
    """`--save-every 2` over 5 steps: OUT-step2 and OUT-step4 beside OUT, each a loadable model
    holding the weights of its step (they differ from each other and from the final ones)."""
    from dart_ray.models.loading import load_model
    from dart_ray.warmstart.sft import sft

    tasks = [make_task("click-button", 1, seed) for seed in range(4)]
    out = tmp_path / "warm"
    sft(TINY, out, tasks, EnvConfig(), steps=5, batch_size=2, lr=1e-2, save_every=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm", "warm-step2", "warm-step4"]
    weights = [
        next(iter(load_model(tmp_path / name).state_dict().values())).clone()
        for name in ("warm-step2", "warm-step4", "warm")
    ]
    assert not any(w.equal(v) for i, w in enumerate(weights) for v in weights[i + 1 :])


def test_a_wall_clock_budget_ends_sft_before_its_steps(tmp_path: Path) -> None:
    """`max_seconds` (`dart-ray sft --minutes`, the experiment's `sft` arm): the run stops
    once the budget is spent, saves, and says how many steps it took."""
    from dart_ray.models.loading import load_model
    from dart_ray.warmstart.sft import sft

    tasks = [make_task("click-button", 1, seed) for seed in range(4)]
    r = sft(TINY, tmp_path / "warm", tasks, EnvConfig(), steps=10**6, batch_size=2, max_seconds=3.0)
    assert 0 < r.steps < 10**6 and r.seconds < 30
    load_model(tmp_path / "warm")  # the weights at the budget's end were written
