"""Does a warm start built before a MiniDesk suite was regenerated see the new held-out
screens? Renders every split a config names, here and at an older commit (that commit's
config, task files and code), and counts the tasks equal by content between them.

    .venv/bin/python scripts/content_keys.py -c configs/multi-step.toml --before 7bc6dca

A task's content is what the policy sees before it acts: the first screen's pixels, the
observation's text and the instruction (`dart_ray.envs.taskfile.content_key`, recomputed here
the same way so that older code, which lacks it, gives comparable keys). The older side runs
in a temporary git worktree of `--before`, under its own code (this script re-run there with
`--keys`). Prints, for each split here, how many of its tasks equal a task of each split
there; writes it as JSON with `--json`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SPLIT_FIELDS = {
    "train": "tasks",
    "validation": "validation_tasks",
    "heldout": "heldout_tasks",
    "ood": "ood_tasks",
}


def keys(config: str) -> dict[str, dict[str, str]]:
    """{split: {content key: task id}} of every split file `config` names, under the
    dart_ray this Python imports."""
    from PIL import Image

    from dart_ray.config import load_config
    from dart_ray.envs.minidesk.env import MiniDeskEnv
    from dart_ray.envs.minidesk.generate import load_tasks

    cfg = load_config(config, [])
    env = MiniDeskEnv(cfg.env)
    out: dict[str, dict[str, str]] = {}
    for split, field in SPLIT_FIELDS.items():
        path = getattr(cfg.env, field, None)
        if path is None:
            continue
        out[split] = {}
        for task in load_tasks(path, split):
            obs = env.reset(task)
            frame = getattr(obs, "frame", None)
            img = frame if frame is not None else Image.open(io.BytesIO(obs.screenshot))
            h = hashlib.blake2b(digest_size=16)
            h.update(f"{img.width}x{img.height}\0".encode())
            h.update(img.convert("RGB").tobytes())
            h.update(b"\0" + (obs.text or "").encode() + b"\0" + task.instruction.encode())
            out[split][h.hexdigest()] = task.task_id
    return out


def keys_at(commit: str, config: str) -> dict[str, dict[str, str]]:
    """`keys(config)` at `commit`: its config, task files and code, in a temporary worktree."""
    repo = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        tree, out = Path(tmp) / "tree", Path(tmp) / "keys.json"
        subprocess.run(
            ["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(tree), commit],
            check=True,
        )
        try:
            env = {**os.environ, "PYTHONPATH": str(tree)}
            cmd = [sys.executable, __file__, "-c", config, "--keys", str(out)]
            subprocess.run(cmd, cwd=tree, env=env, check=True)
            return json.loads(out.read_text())
        finally:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)])


def overlap(
    now: dict[str, dict[str, str]], before: dict[str, dict[str, str]]
) -> dict[str, dict[str, int]]:
    """{split here: {split there: distinct contents (screen and instruction) here that a task
    there shows}}. A held-out or validation split holds each content once; a training split
    may repeat one."""
    return {
        split: {old: len(ks.keys() & oks.keys()) for old, oks in before.items()}
        for split, ks in now.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-c", "--config", required=True, help="a MiniDesk config naming its splits")
    ap.add_argument("--before", help="the older commit to compare with")
    ap.add_argument("--json", type=Path, help="write the counts here")
    ap.add_argument("--keys", type=Path, help=argparse.SUPPRESS)  # the older side's run
    args = ap.parse_args(argv)
    if args.keys:
        args.keys.write_text(json.dumps(keys(args.config)))
        return 0
    if not args.before:
        ap.error("--before COMMIT is required")
    now, before = keys(args.config), keys_at(args.before, args.config)
    counts = overlap(now, before)
    width = max(len(s) for s in before)
    print(f"distinct contents here that a task at {args.before} shows ({args.config})")
    print(f"{'here':<12}{'distinct':>9}  " + "  ".join(f"{s:>{width}}" for s in before))
    for split, row in counts.items():
        cells = "  ".join(f"{row[s]:>{width}}" for s in before)
        print(f"{split:<12}{len(now[split]):>9}  {cells}")
    if args.json:
        result = {
            "config": args.config,
            "before": args.before,
            "distinct": {s: len(k) for s, k in now.items()},
            "distinct_before": {s: len(k) for s, k in before.items()},
            "equal": counts,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
