"""Real trajectories from the tiny policy, for the trainer tests: the HF engine answers
synthetic screenshots, so prompt ids, image tokens and behaviour log-probs are exactly what a
rollout would log."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from dart_ray.data.batches import to_record_batch
from dart_ray.data.curation import split_steps
from dart_ray.engines.base import SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.records import Status, Step, Task, Trajectory
from dart_ray.store import Store
from dart_ray.uitars.actions import parse_response
from tests.policy_helpers import png, request


def policy_trajectories(
    engine: HFEngine,
    run_id: str,
    task_id: str,
    rnd: int,
    rewards: list[float],
    version: int = 0,
    max_new_tokens: int = 6,
    sampling: SamplingParams | None = None,
) -> list[Trajectory]:
    """One GRPO group: one single-step trajectory per reward, sampled from `engine`."""
    sampling = sampling or SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    out = []
    for i, reward in enumerate(rewards):
        shot = png((40 * i % 256, 90, 160), box=10 + 7 * i)
        req = request(f"click button {task_id}", (shot,), sampling)
        [gen] = engine.generate_sync([engine.processor.encode(req.messages)], [sampling], version)
        step = Step(
            step_idx=0,
            prompt_ids=gen.prompt_ids,
            response_ids=gen.response_ids,
            behaviour_logprobs=gen.logprobs,
            entropy=gen.entropy,
            weight_version=version,
            response_text=gen.text,
            action=parse_response(gen.text).action,
            screenshot=shot,
        )
        gid = f"{task_id}#{rnd}"
        out.append(
            Trajectory(
                trajectory_id=f"{gid}/{i}",
                run_id=run_id,
                task=Task(task_id, f"click button {task_id}", "minidesk"),
                steps=(step,),
                reward=reward,
                status=Status.OK,
                group_id=gid,
                group_size=len(rewards),
                start_version=version,
            )
        )
    return out


def log_group(store: Store, trajectories: list[Trajectory]) -> None:
    store.log.append_many([(t, store.blobs.write(t)) for t in trajectories])


def model_dir(path: Path) -> str:
    return str(path)


def samples(
    engine: HFEngine, advantages: list[float], sampling: SamplingParams | None = None
) -> pa.RecordBatch:
    """Step samples of one group the engine plays, with the given advantage per trajectory."""
    trajs = policy_trajectories(engine, "run", "t", 0, [0.0] * len(advantages), sampling=sampling)
    return to_record_batch(
        [s for t, a in zip(trajs, advantages, strict=True) for s in split_steps(t, a)]
    )
