"""Small builders of records for tests."""

from __future__ import annotations

from dart_ray.records import Action, ActionKind, Status, Step, Task, Trajectory


def make_step(idx: int = 0, version: int = 0, n_tokens: int = 3) -> Step:
    return Step(
        step_idx=idx,
        prompt_ids=tuple(range(10 + idx)),
        response_ids=tuple(range(100, 100 + n_tokens)),
        behaviour_logprobs=tuple(-0.5 * (i + 1) for i in range(n_tokens)),
        entropy=tuple(0.25 * (i + 1) for i in range(n_tokens)),
        weight_version=version,
        response_text=f"Thought: step {idx}\nAction: click(start_box='(10,20)')",
        action=Action(ActionKind.CLICK, point=(10.0, 20.0)),
        screenshot=b"\x89PNG fake " + bytes([idx % 256]),
    )


def make_trajectory(
    tid: str,
    *,
    run_id: str = "run-a",
    task_id: str = "task-0",
    reward: float = 0.0,
    status: Status = Status.OK,
    version: int = 0,
    n_steps: int = 2,
    instruction: str = "click the OK button",
    group_id: str = "",
    group_size: int = 0,
) -> Trajectory:
    return Trajectory(
        trajectory_id=tid,
        run_id=run_id,
        task=Task(task_id=task_id, instruction=instruction, env="minidesk", config={"seed": 1}),
        steps=tuple(make_step(i, version) for i in range(n_steps)),
        reward=reward,
        status=status,
        trace_id=tid,
        group_id=group_id,
        group_size=group_size,
        started_at=1.0,
        finished_at=2.0,
    )
