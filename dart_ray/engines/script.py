"""The script engine: a policy that plays written solutions (`policy.engine = "script"`).

What it is for: checking an environment and its evaluator end to end with answers known to
be right (`dart-ray eval` with a task's solution must score 1, with an empty one 0), and
trajectories that succeed, to seed the success-replay pool where a tiny policy finds none.

`policy.model_path` is a JSONL file of scripts, one per task:

    {"task_id": "os/5ea617a3", "instruction": "Create a folder named ...",
     "actions": ["hotkey(key='ctrl alt t')", "wait()", "type(content='mkdir x\\n')"]}

Actions are UI-TARS action text in screen pixels. A request is matched to its script by the
task's instruction (the text after "## Task" in the prompt's first user turn); its step is
read from the newest response in the prompt, whose Thought says `script step k of n`, so the
engine keeps no state and any number of episodes of any tasks can run at once (the prompt
keeps the newest response: `policy.history_turns` >= 1). After the last action it answers
`finished(content='')`; an empty script answers that at once, so the end state is the
initial one. A task without a script is an error naming it (a POLICY_ERROR, never a score).

Each response token is a UTF-8 byte with log-probability 0 and entropy 0: the script is a
deterministic policy, and its trajectories are trained on like any other.
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path

from PIL import Image

from dart_ray.engines.base import (
    Engine,
    GenerateRequest,
    Generation,
    PreparedRequest,
    SamplingParams,
    refuse_forced,
)
from dart_ray.models.weights import PackedWeights
from dart_ray.uitars.prompts import ChatMessage, TextPart

STEP = re.compile(r"script step (\d+) of (\d+)")
TASK_HEADER = "## Task\n"


class ScriptError(ValueError):
    """A script file that cannot be read, or a request no script answers."""


def read_scripts(path: Path) -> dict[str, list[str]]:
    """Instruction -> actions, from a JSONL file (or a folder holding `scripts.jsonl`)."""
    file = path / "scripts.jsonl" if path.is_dir() else path
    try:
        lines = file.read_text().splitlines()
    except OSError as e:
        raise ScriptError(
            f"policy.model_path = {path}: cannot read scripts: {e.strerror}"
        ) from None
    scripts: dict[str, list[str]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            instruction, actions = row["instruction"], row["actions"]
        except (ValueError, KeyError, TypeError) as e:
            raise ScriptError(f"{file}:{n}: needs 'instruction' and 'actions': {e}") from None
        if not isinstance(instruction, str) or not (
            isinstance(actions, list) and all(isinstance(a, str) for a in actions)
        ):
            raise ScriptError(f"{file}:{n}: 'instruction' is text, 'actions' a list of text")
        instruction = instruction.strip()  # as the prompt shows it (build_messages strips)
        if instruction in scripts and scripts[instruction] != actions:
            raise ScriptError(f"{file}:{n}: a second, different script for {instruction!r}")
        scripts[instruction] = actions
    return scripts


def _text(m: ChatMessage) -> str:
    return "".join(p.text for p in m.parts if isinstance(p, TextPart))


def next_response(scripts: dict[str, list[str]], messages: Sequence[ChatMessage]) -> str:
    """The scripted response to a prompt (see the module docstring)."""
    prompt = next(
        (_text(m) for m in messages if m.role == "user" and TASK_HEADER in _text(m)), None
    )
    if prompt is None:
        raise ScriptError("the prompt has no '## Task' section to match a script by")
    instruction = prompt.split(TASK_HEADER, 1)[1].strip()
    actions = scripts.get(instruction)
    if actions is None:
        raise ScriptError(f"no script for the task {instruction[:120]!r}")
    done = 0
    for m in reversed(messages):
        if m.role == "assistant":
            found = STEP.search(_text(m))
            done = int(found.group(1)) if found else 0
            break
    n = len(actions)
    if done >= n:
        return f"Thought: script step {n + 1} of {n}: it is done.\nAction: finished(content='')"
    return f"Thought: script step {done + 1} of {n}.\nAction: {actions[done]}"


class ScriptEngine(Engine):
    """Answers from `read_scripts(path)`; weight updates are accepted and change nothing."""

    name = "script"

    def __init__(self, path: Path, interrupt_on_update: bool = False) -> None:
        super().__init__(interrupt_on_update)
        self.scripts = read_scripts(path)

    def prepare(self, request: GenerateRequest, defaults: SamplingParams) -> PreparedRequest:
        refuse_forced(request, "script")
        images = tuple(Image.open(io.BytesIO(b)) for m in request.messages for b in m.images)
        text = next_response(self.scripts, request.messages)  # a bad request fails here, alone
        return PreparedRequest(request.sampling or defaults, prompt_text=text, images=images)

    async def generate(self, requests: Sequence[PreparedRequest]) -> list[Generation]:
        out = []
        for r in requests:
            t0 = time.perf_counter()
            async with self.gate.generating() as lease:
                ids = tuple(r.prompt_text.encode())
                version, _ = lease.versions(len(ids))
            size = r.images[-1].size if r.images else (1920, 1080)
            out.append(
                Generation(
                    text=r.prompt_text,
                    response_ids=ids,
                    prompt_ids=tuple(b"<script>"),
                    logprobs=(0.0,) * len(ids),
                    entropy=(0.0,) * len(ids),
                    weight_version=version,
                    finish_reason="stop",
                    model_sizes=(size,),  # the script's coordinates are screen pixels
                    latency_s=time.perf_counter() - t0,
                )
            )
        return out

    async def _load(self, weights: PackedWeights) -> None:
        """A script has no weights: a published version is counted, nothing else."""
