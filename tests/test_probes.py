"""The binding probes (dart_ray/evaluation/probes.py): the probe fits what is there and nothing else,
and the screens it reads are the ones the policy sees."""

from __future__ import annotations

from pathlib import Path

import torch

from dart_ray.config import load_config
from dart_ray.envs.minidesk.generate import load_tasks
from dart_ray.evaluation.probes import (
    MERGE_PX,
    first_coordinate_index,
    fit_probe,
    read_screens,
    run_probes,
)
from dart_ray.models.loading import PolicyProcessor, load_model

REPO = Path(__file__).resolve().parents[1]


def test_a_probe_finds_a_planted_signal_and_nothing_in_noise() -> None:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 4, (800,), generator=g)
    planted = torch.nn.functional.one_hot(y, 4).float() + 0.3 * torch.randn(800, 4, generator=g)
    x = torch.cat([planted, torch.randn(800, 12, generator=g)], 1)
    assert fit_probe(x[:500], y[:500], x[500:], y[500:], 4) > 0.95
    noise = torch.randn(800, 16, generator=g)  # no relation to y: about 1 in 4
    assert fit_probe(noise[:500], y[:500], noise[500:], y[500:], 4) < 0.40


def test_the_coordinate_index_is_the_token_that_starts_the_first_number() -> None:
    proc = PolicyProcessor.from_dir(REPO / "fixtures" / "tiny-ground")
    text = "Thought: I click the 'Print' button.\nAction: click(start_box='(42,70)')"
    ids = proc.tokenizer(text, add_special_tokens=False)["input_ids"]
    k = first_coordinate_index(proc, ids)
    assert proc.decode(ids[:k]).endswith("start_box='(")
    assert proc.decode(ids[k : k + 1])[0] == "4"


def test_screens_hold_the_named_button_its_token_and_normalised_attention() -> None:
    cfg = load_config(REPO / "configs" / "learning.toml")
    model = load_model(REPO / "fixtures" / "tiny-ground")
    model.set_attn_implementation("eager")
    proc = PolicyProcessor.from_dir(REPO / "fixtures" / "tiny-ground")
    tasks = load_tasks(cfg.env.heldout_tasks)[:6]
    screens = read_screens(model, proc, cfg.env, tasks)
    cells = (cfg.env.screen_width // MERGE_PX) * (cfg.env.screen_height // MERGE_PX)
    for task, s in zip(tasks, screens, strict=True):
        assert len(s.buttons) == 4
        assert f"'{s.buttons[s.target].label}'" in task.instruction  # the one it names
        assert all(0 <= b.cell < cells for b in s.buttons)
        assert s.vision.shape == (cells, model.config.text_config.hidden_size)
        layers = model.config.text_config.num_hidden_layers
        assert s.hidden.shape == (layers + 1, model.config.text_config.hidden_size)
        assert torch.allclose(s.image_attention.sum(-1), torch.ones(layers))
    r = run_probes(screens[:3], screens[3:])
    assert r["labels"] >= 4 and len(r["language"]) == layers + 1  # type: ignore[arg-type]
