"""Probe a policy for where the label-to-button binding fails (dart_ray/evaluation/probes.py).

    .venv/bin/python scripts/probe_binding.py [--model fixtures/tiny-ground] [-c configs/learning.toml]
        [--train 400] [--heldout 300] [--json out.json]

Reads the screens of `env.tasks` (probe training) and `env.heldout_tasks` (probe scores) of
the config, prints the tables and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dart_ray.config import load_config  # noqa: E402
from dart_ray.envs.minidesk.generate import load_tasks  # noqa: E402
from dart_ray.evaluation.probes import read_screens, run_probes  # noqa: E402
from dart_ray.models.loading import PolicyProcessor, load_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="fixtures/tiny-ground")
    ap.add_argument("-c", "--config", default="configs/learning.toml")
    ap.add_argument("--train", type=int, default=400, help="training screens for the probes")
    ap.add_argument("--heldout", type=int, default=300, help="held-out screens they are scored on")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    cfg = load_config(a.config)
    model = load_model(a.model)
    model.set_attn_implementation("eager")  # attention weights are returned
    proc = PolicyProcessor.from_dir(a.model)
    if cfg.env.heldout_tasks is None:
        ap.error(f"{a.config} has no env.heldout_tasks")
    train = read_screens(model, proc, cfg.env, load_tasks(cfg.env.tasks)[: a.train])
    test = read_screens(model, proc, cfg.env, load_tasks(cfg.env.heldout_tasks)[: a.heldout])
    r = run_probes(train, test)
    r["model"], r["config"], r["seconds"] = a.model, a.config, round(time.perf_counter() - t0, 1)
    v = r["vision_label"]
    print(f"{r['model']}: {r['train_screens']} training / {r['test_screens']} held-out screens, "
          f"{r['labels']} labels")  # fmt: skip
    print(f"vision -> label: vision tokens {v['vision_tokens']:.1%}, raw pixels "
          f"{v['raw_pixels']:.1%}, majority {v['majority']:.1%}")  # fmt: skip
    ch = r["language_chance"]
    print(f"hidden state at the first coordinate digit (chance: index {ch['target_index']:.1%}, "
          f"label {ch['target_label']:.1%})")  # fmt: skip
    for row in r["language"]:
        print(f"  layer {row['layer']}: target index {row['target_index']:.1%}, "
              f"target label {row['target_label']:.1%}")  # fmt: skip
    print("attention from that position over image tokens (per cell)")
    for row in r["attention"]:
        print(f"  layer {row['layer']}: target cell {row['on_target_cell']:.3f}, each other "
              f"button cell {row['on_each_other_button_cell']:.3f}, uniform {row['uniform_cell']:.3f}")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
