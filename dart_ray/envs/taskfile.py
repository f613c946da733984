"""Task files: JSONL, one `Task` per line, read strictly; and what makes two tasks the same
(`content_key`: the first screen and the instruction a policy sees).

A task file is input that someone wrote by hand or generated elsewhere, and a bad line found
mid-run would cost a run. So every line is checked when the file is read, before anything
starts, and the first problem is reported as `path:line: field: problem`. Task ids are the
durable log's keys, so they must fit its column (191 characters) and must not start or end
with whitespace (MySQL and MariaDB compare `'a'` and `'a '` as equal), and no id may appear
twice in one file.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from dart_ray.config import ConfigError
from dart_ray.records import Task

if TYPE_CHECKING:
    from dart_ray.envs.base import Env

MAX_ID_LEN = 191
"""Width of `rollout_run.task_id` (and every identifier column of the durable log)."""

FIELDS = {"task_id": str, "instruction": str, "env": str, "config": dict, "split": str}
REQUIRED = ("task_id", "instruction", "env")


class TaskFileError(ConfigError):
    """A task file that cannot be used; the message names the file, line and field."""


def check_task_id(task_id: Any) -> str | None:
    """Why `task_id` cannot be a task id, or None if it can."""
    if not isinstance(task_id, str) or not task_id:
        return "must be a non-empty string"
    if len(task_id) > MAX_ID_LEN:
        return f"is {len(task_id)} characters; at most {MAX_ID_LEN} fit the durable log"
    if task_id != task_id.strip():
        return "must not start or end with whitespace"
    return None


def task_from_dict(d: Any, where: str, split: str = "train") -> Task:
    """One task line, already decoded; TaskFileError names `where` and the field."""
    if not isinstance(d, dict):
        raise TaskFileError(f"{where}: a task must be a JSON object, not {type(d).__name__}")
    for key in d:
        if key not in FIELDS:
            raise TaskFileError(f"{where}: {key}: unknown field (fields: {', '.join(FIELDS)})")
    for key in REQUIRED:
        if key not in d:
            raise TaskFileError(f"{where}: {key}: missing")
    for key, kind in FIELDS.items():
        if key in d and not isinstance(d[key], kind):
            raise TaskFileError(
                f"{where}: {key}: must be a JSON {'object' if kind is dict else 'string'}, "
                f"got {json.dumps(d[key])[:60]}"
            )
    if (why := check_task_id(d["task_id"])) is not None:
        raise TaskFileError(f"{where}: task_id: {why}")
    if not d["env"]:
        raise TaskFileError(f"{where}: env: must be a non-empty string")
    return Task(
        d["task_id"], d["instruction"], d["env"], d.get("config", {}), d.get("split", split)
    )


def read_task_file(path: str | Path, split: str = "train") -> list[Task]:
    """Every task of a JSONL file (blank lines skipped); TaskFileError at the first bad line."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TaskFileError(f"task file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFileError(f"task file {p} cannot be read: {e}") from None
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{p}:{n}: not JSON ({e})") from None
        task = task_from_dict(d, f"{p}:{n}", split)
        if task.task_id in seen:
            raise TaskFileError(
                f"{p}:{n}: task_id: {task.task_id!r} is also on line {seen[task.task_id]}"
            )
        seen[task.task_id] = n
        tasks.append(task)
    if not tasks:
        raise TaskFileError(f"task file {p} holds no task")
    return tasks


SPLITS = ("train", "validation", "heldout", "ood")
"""A suite's splits, in the order a generator fills them (earlier splits own a content)."""


def content_key(env: Env, task: Task) -> str:
    """What a policy sees of `task` before it acts: a digest of the first screen's pixels (not
    its PNG bytes, which depend on the encoder), the observation's text and the instruction."""
    obs = env.reset(task)
    frame = getattr(obs, "frame", None)
    img = frame if frame is not None else Image.open(io.BytesIO(obs.screenshot))
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{img.width}x{img.height}\0".encode())
    h.update(img.convert("RGB").tobytes())
    h.update(b"\0" + (obs.text or "").encode() + b"\0" + task.instruction.encode())
    return h.hexdigest()
