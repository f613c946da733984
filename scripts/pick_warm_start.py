"""Choose a warm start on the validation split: the earliest SFT checkpoint that reaches a
greedy validation success of at least `--at-least` (partial competence, what RL starts from).

    dart-ray sft -c configs/click-target.toml --base models/tiny --out models/ct/sft \\
        --steps 800 --save-every 20 --tasks 1000 --lr 1e-3
    python scripts/pick_warm_start.py -c configs/click-target.toml models/ct/sft --at-least 0.15

Reads `OUT-stepN` (every N) and `OUT` itself, in step order; prints each one's validation
success and the pick, and writes the table as JSON (`--json`). The held-out split is never
read: the choice is made before the number it is judged by.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from dart_ray.config import load_config
from dart_ray.evaluation.local import run_eval


def candidates(out: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every checkpoint an SFT run with --save-every wrote, in step order
    (the final folder `out` last, numbered after the rest)."""
    found = []
    for p in out.parent.glob(f"{out.name}-step*"):
        m = re.fullmatch(rf"{re.escape(out.name)}-step(\d+)", p.name)
        if m and (p / "config.json").is_file():
            found.append((int(m.group(1)), p))
    found.sort()
    if (out / "config.json").is_file():
        found.append(((found[-1][0] if found else 0) + 1, out))
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the --out folder of the SFT run")
    ap.add_argument("-c", "--config", required=True, help="the suite's config")
    ap.add_argument("--at-least", type=float, default=0.15, help="validation success to reach")
    ap.add_argument("--from-step", type=int, default=0, help="skip checkpoints before this")
    ap.add_argument("--json", type=Path, default=None, help="write the table here")
    a = ap.parse_args(argv)
    cfg = load_config(a.config, [])
    table, pick = [], None
    for step, path in candidates(a.out):
        if step < a.from_step:
            continue
        rate = run_eval(cfg, path, "validation").success(1)
        table.append({"step": step, "path": str(path), "validation": rate})
        print(f"{path}: validation {rate:.1%}", flush=True)
        if rate >= a.at_least:
            pick = str(path)
            break
    if a.json:
        a.json.write_text(json.dumps({"at_least": a.at_least, "pick": pick, "table": table}) + "\n")
    if pick is None:
        print(f"no checkpoint reached {a.at_least:.0%} on validation", file=sys.stderr)
        return 1
    print(f"pick: {pick}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
