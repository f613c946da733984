"""`dart-ray sft` on MiniWoB++ (marker `browser`): the oracle's demonstrations from the live
page, and a few SFT steps that write a loadable model, through the CLI as documented."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("miniwob", reason="needs the browser extra")

from dart_ray.cli import main
from dart_ray.config import EnvConfig
from dart_ray.envs.miniwob.tasks import make_task
from dart_ray.models.loading import PolicyProcessor, load_model
from dart_ray.uitars.actions import CoordinateMap, parse_response
from dart_ray.warmstart.sft import demonstrations

pytestmark = pytest.mark.browser
REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "fixtures" / "tiny-multi"  # the tiny model at min_pixels 18816, as models/tiny


def test_miniwob_demonstrations_click_type_and_submit() -> None:
    processor = PolicyProcessor.from_dir(TINY)
    task = make_task("enter-text", 1, instruction='Enter "Jerald" into the text field ...')
    demos = list(demonstrations([task], processor, EnvConfig(kind="miniwob")))
    texts = [processor.decode(d.response_ids) for d in demos]
    assert [t.split("\n")[0] for t in texts] == [
        "Thought: I click the text field.",
        "Thought: I type 'Jerald'.",
        "Thought: I click the 'Submit' button.",
    ]
    # the 160x210 task area is 168x224 in the model's frame; the field is at (5, 56, 128x21),
    # its centre (69, 66) on the page is (72, 70) there: 69 * 168/160 = 72.45, 66 * 224/210 = 70.4
    assert texts[0].endswith("click(start_box='(72,70)')")
    coords = CoordinateMap.for_screen(160, 210, processor.min_pixels, processor.max_pixels)
    assert (coords.model_width, coords.model_height) == (168, 224)
    assert parse_response(texts[1], coords).action.text == "Jerald"
    assert len(demos[2].prompt_ids) > len(demos[1].prompt_ids) > len(demos[0].prompt_ids)


def test_sft_cli_on_miniwob_demonstrations_saves_a_model(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.jsonl"
    lines = [
        {
            "task_id": f"miniwob/enter-text/{s}",
            "instruction": "Enter the word into the text field and press Submit.",
            "env": "miniwob",
            "config": {"subdomain": "enter-text", "seed": s},
        }
        for s in range(3)
    ]
    tasks.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "warm"
    rc = main(
        [
            "sft", "-c", str(REPO / "configs" / "miniwob.toml"), "--base", str(TINY),
            "--out", str(out), "--steps", "2", "--batch-size", "4", f"env.tasks={tasks}",
        ]
    )  # fmt: skip
    assert rc == 0
    assert (out / "model.safetensors").is_file()
    load_model(out)
