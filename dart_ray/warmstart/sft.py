"""`dart-ray sft`: a warm start from oracle demonstrations (MiniDesk or MiniWoB++).

The oracle plays training tasks; at every step the prompt is built exactly as a rollout
builds it (same prompt text, history window, screenshots) and the target is the oracle's
action in the UI-TARS format, with coordinates in the model's resized frame. Training
minimises the negative log-likelihood of the response tokens with the same forward pass the
RL trainer uses, so the warm-started policy emits the action grammar the rollouts parse.
Stopping early leaves a policy with partial competence: the starting point RL improves on.
"""

from __future__ import annotations

import logging
import random
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch
from transformers import PreTrainedModel

from dart_ray.config import EnvConfig
from dart_ray.models.loading import PolicyProcessor, load_model
from dart_ray.records import SAMPLE_SCHEMA, ActionKind, Task
from dart_ray.train.forward import collate, response_logprobs
from dart_ray.uitars.prompts import Turn, build_messages
from dart_ray.warmstart.writers import make_writer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Demo:
    prompt_ids: list[int]
    response_ids: list[int]
    images: list[bytes]


def demonstrations(
    tasks: Sequence[Task],
    processor: PolicyProcessor,
    env_config: EnvConfig,
    *,
    history_images: int = 1,
    history_turns: int = 5,
    max_steps: int = 8,
) -> Iterator[Demo]:
    """(prompt, oracle response) pairs from oracle episodes on the tasks of `env_config.kind`
    (MiniDesk or MiniWoB++, `dart_ray.warmstart.writers`)."""
    writer = make_writer(processor, env_config)
    try:
        for task in tasks:
            obs = writer.reset(task)
            turns = [Turn(obs.screenshot)]
            for _ in range(max_steps):
                action, text, response = writer.next_response()
                messages = build_messages(task.instruction, turns, history_images, history_turns)
                enc = processor.encode(messages)
                images = [t.screenshot for t in turns[-history_images:]]
                yield Demo(list(enc.input_ids), response, images)
                if action.kind in (ActionKind.FINISHED, ActionKind.CALL_USER):
                    break
                result = writer.step(action)
                if result.done:  # a commit ends the episode: a rollout never asks again
                    break
                turns[-1] = Turn(turns[-1].screenshot, text)
                turns.append(Turn(result.observation.screenshot))
    finally:
        writer.close()


def _batch(demos: Sequence[Demo]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "trajectory_id": ["sft"] * len(demos),
            "task_id": ["sft"] * len(demos),
            "step_idx": [0] * len(demos),
            "weight_version": [0] * len(demos),
            "prompt_ids": [d.prompt_ids for d in demos],
            "response_ids": [d.response_ids for d in demos],
            "behaviour_logprobs": [[0.0] * len(d.response_ids) for d in demos],
            "loss_mask": [[1] * len(d.response_ids) for d in demos],
            "advantage": [0.0] * len(demos),
            "images": [d.images for d in demos],
            "token_versions": [[] for _ in demos],
        },
        schema=SAMPLE_SCHEMA,
    )


@dataclass
class SFTResult:
    out: Path
    steps: int
    demonstrations: int
    final_loss: float
    seconds: float


def sft(
    base: Path,
    out: Path,
    tasks: Sequence[Task],
    env_config: EnvConfig,
    *,
    steps: int = 200,
    batch_size: int = 16,
    lr: float = 1e-3,
    seed: int = 0,
    history_images: int = 1,
    save_every: int = 0,
    max_seconds: float | None = None,
) -> SFTResult:
    """Fine-tune the model in `base` on oracle demonstrations; write an HF folder to `out`.

    With `save_every` N > 0 the weights after every N steps are also written beside `out`,
    as `OUT-stepN`: one SFT run then yields the candidate warm starts of a sweep over the
    stopping point (docs/LEARNING.md picks warm starts with partial competence that way).

    With `max_seconds` the run also stops once that much time has passed since it began
    (the demonstrations' collection included): the `sft` arm of `dart-ray experiment` gets
    the same wall-clock as an RL run."""
    if save_every < 0:
        raise ValueError(f"save_every must be >= 0, got {save_every}")
    t0 = time.monotonic()
    torch.manual_seed(seed)
    processor = PolicyProcessor.from_dir(base)
    model = load_model(base)
    model.train()
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    pool = list(demonstrations(order, processor, env_config, history_images=history_images))
    if not pool:
        raise ValueError("no demonstrations: the task list is empty")
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    suppressed = torch.tensor(processor.suppressed_ids())
    loss_v = float("nan")
    done = 0
    for step in range(steps):
        if max_seconds is not None and time.monotonic() - t0 >= max_seconds:
            break
        demos = rng.sample(pool, min(batch_size, len(pool)))
        mb = collate(
            _batch(demos),
            processor.image_processor,
            image_pad_id=processor.image_pad_id,
            pad_id=processor.pad_id,
        )
        logp, _ = response_logprobs(model, mb, None, suppressed)
        mask = mb.response_mask.to(logp.dtype)
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_v = float(loss.detach())
        if step % 50 == 0:
            log.info("sft step %d loss %.3f", step, loss_v)
        done = step + 1
        if save_every and done % save_every == 0 and done < steps:
            _save(model, processor, base, out.with_name(f"{out.name}-step{done}"))
            model.train()
    _save(model, processor, base, out)
    return SFTResult(out, done, len(pool), loss_v, time.monotonic() - t0)


def _save(model: PreTrainedModel, processor: PolicyProcessor, base: Path, out: Path) -> None:
    """The model as an HF folder at `out`, written beside it first and renamed into place."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.eval()
    model.save_pretrained(tmp)
    processor.tokenizer.save_pretrained(tmp)
    processor.image_processor.save_pretrained(tmp)
    for extra in ("dart_ray_tiny.json", "generation_config.json"):
        if (base / extra).is_file() and not (tmp / extra).is_file():
            shutil.copy2(base / extra, tmp / extra)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
