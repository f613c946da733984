"""Typed records that flow through dart-ray, and their Arrow schemas, defined once.

A `Trajectory` is what the rollouter produces: the task, one `Step` per policy turn, the
reward from the environment's evaluator and a `Status` saying how the episode ended. Every
step carries the weight version that generated it, the exact prompt and response token ids
(so the trainer never re-tokenises) and the behaviour log-probs (for truncated importance
sampling against the policy that actually acted).

Two Arrow schemas derive from these records:

- `STEP_SCHEMA`: one row per step, the on-disk form of a trajectory (Parquet in blob storage).
  Trajectory-level fields travel in the schema metadata, so a trajectory with no steps (an
  environment that failed on reset) still round-trips.
- `SAMPLE_SCHEMA`: one row per step sample, what the curator streams to trainer ranks.
"""

from __future__ import annotations

import enum
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pyarrow as pa

from dart_ray.arrays import list_array, list_views


class Status(enum.StrEnum):
    """How an episode ended. Only OK and TRUNCATED trajectories can be trained on."""

    OK = "OK"
    """The policy finished (or the evaluator judged the end state) within the step limit."""
    TRUNCATED = "TRUNCATED"
    """The step limit was reached; the evaluator still scored the end state."""
    ABORTED = "ABORTED"
    """The environment crashed mid-episode; the episode is retried, never scored as 0."""
    ENV_ERROR = "ENV_ERROR"
    """Retries ran out on environment failures; the task's group is not trained."""
    POLICY_ERROR = "POLICY_ERROR"
    """The policy server failed to answer; nothing about the task's difficulty is learned."""

    @property
    def trainable(self) -> bool:
        return self in (Status.OK, Status.TRUNCATED)


class ActionKind(enum.StrEnum):
    """The UI-TARS-1.5 computer-use action space, plus INVALID for unparseable output."""

    CLICK = "click"
    LEFT_DOUBLE = "left_double"
    RIGHT_SINGLE = "right_single"
    DRAG = "drag"
    HOTKEY = "hotkey"
    TYPE = "type"
    SCROLL = "scroll"
    WAIT = "wait"
    FINISHED = "finished"
    CALL_USER = "call_user"
    INVALID = "invalid"


@dataclass(frozen=True, slots=True)
class Task:
    """One task of an environment suite."""

    task_id: str
    instruction: str
    env: str
    """Environment kind (a registry name or an import path `pkg.mod:Class`)."""
    config: dict[str, Any] = field(default_factory=dict)
    """Environment-specific setup and evaluator description (JSON-serialisable)."""
    split: str = "train"


INLINE_ARG_BYTES = 100 * 1024
"""Ray's default `max_direct_call_object_size`: a task or actor argument up to this size
travels inline, in the task spec; a larger one goes to the object store."""


@dataclass(frozen=True, slots=True)
class PackedTasks:
    """A task list as compressed JSON, for an actor's constructor.

    An actor that Ray restarts is rebuilt from its creation spec, which the GCS keeps; an
    argument too large to travel inline lives in the object store instead, and if that copy
    is lost the restart fails (Ray warns with an `E` line, ray#53727). Suites compress about
    20x (the 1,000 click-target tasks: 274 KB pickled, 14 KB packed), so thousands of tasks
    stay inline and a restarted rollouter always gets its tasks back."""

    blob: bytes

    @classmethod
    def of(cls, tasks: Sequence[Task]) -> PackedTasks:
        rows = [[t.task_id, t.instruction, t.env, t.config, t.split] for t in tasks]
        return cls(zlib.compress(json.dumps(rows, separators=(",", ":")).encode(), 6))

    def unpack(self) -> list[Task]:
        return [Task(*row) for row in json.loads(zlib.decompress(self.blob))]

    @property
    def inline(self) -> bool:
        """Small enough to travel in the task spec (see the class docstring)."""
        return len(self.blob) <= INLINE_ARG_BYTES


@dataclass(frozen=True, slots=True)
class Observation:
    """What the policy sees after a reset or a step."""

    screenshot: bytes
    """PNG-encoded screenshot."""
    width: int
    height: int
    text: str = ""
    accessibility: str | None = None


@dataclass(frozen=True, slots=True)
class Action:
    """A parsed action, in screen pixels. `error` says why it was not carried out: the
    parser's reason for an INVALID action, or `invalid action: <reason>` for an action the
    environment could not carry out (the step keeps what the model wrote, and the reason)."""

    kind: ActionKind
    point: tuple[float, float] | None = None
    end_point: tuple[float, float] | None = None
    text: str | None = None
    """`type` content, `hotkey` keys, or `finished` content."""
    direction: str | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Step:
    """One policy turn: the prompt it saw, what it generated, and what happened.

    The per-token sequences are tuples where the rollouter built the step from a generation,
    and `ArraySeq`s (read-only views of the blob's Arrow buffers) where it was read back from
    a blob: the two compare and hash alike, so a round trip gives an equal step."""

    step_idx: int
    prompt_ids: Sequence[int]
    response_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    """Log-prob of each response token under the policy that sampled it."""
    weight_version: int
    response_text: str
    action: Action
    screenshot: bytes = b""
    """PNG of the observation this step acted on (the newest image of its prompt)."""
    entropy: Sequence[float] = ()
    """Per-token entropy of the sampling distribution (may be empty for engines without it)."""
    num_images: int = 1
    """Screenshots in this step's prompt: those of steps (step_idx - num_images, step_idx]."""
    token_versions: Sequence[int] = ()
    """The version that sampled each response token where a weight update landed mid-response
    (partial rollouts); empty when every token is `weight_version`'s, which is the oldest."""

    def __post_init__(self) -> None:
        if len(self.behaviour_logprobs) != len(self.response_ids):
            raise ValueError(
                f"step {self.step_idx}: {len(self.behaviour_logprobs)} log-probs for "
                f"{len(self.response_ids)} response tokens"
            )
        if self.entropy and len(self.entropy) != len(self.response_ids):
            raise ValueError(
                f"step {self.step_idx}: {len(self.entropy)} entropies for "
                f"{len(self.response_ids)} response tokens"
            )
        if self.token_versions and len(self.token_versions) != len(self.response_ids):
            raise ValueError(
                f"step {self.step_idx}: {len(self.token_versions)} token versions for "
                f"{len(self.response_ids)} response tokens"
            )


@dataclass(frozen=True, slots=True)
class Trajectory:
    """A finished (or failed) episode of one task."""

    trajectory_id: str
    run_id: str
    task: Task
    steps: tuple[Step, ...]
    reward: float
    status: Status
    trace_id: str = ""
    """Groups the retries of one rollout slot (the id of the first attempt)."""
    group_id: str = ""
    """The GRPO group (one rollout round of one task) this trajectory belongs to."""
    group_size: int = 0
    """How many rollout slots the group has (its final trajectories, retries excluded)."""
    start_version: int = -1
    """The weight version published when the episode started (stands in for the step
    versions of an episode that has none, e.g. an environment that failed on reset)."""
    started_at: float = 0.0
    finished_at: float = 0.0
    error: str | None = None
    """Why the episode was aborted or failed, for ABORTED / ENV_ERROR / POLICY_ERROR: the
    error's message, without Ray's banner and traceback (`envs.base.error_message`)."""

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def min_version(self) -> int:
        """The oldest weight version that acted in this episode (`start_version` with no steps).

        Staleness is measured from it: an episode is as stale as its oldest step.
        """
        return min((s.weight_version for s in self.steps), default=self.start_version)

    @property
    def max_version(self) -> int:
        """The newest weight version that sampled a token in this episode."""
        return max(
            (max(s.token_versions, default=s.weight_version) for s in self.steps),
            default=self.start_version,
        )

    def with_status(self, status: Status, error: str | None = None) -> Trajectory:
        return replace(self, status=status, error=error)


# --------------------------------------------------------------------------- Arrow schemas

_POINT = pa.struct([("x", pa.float64()), ("y", pa.float64())])
ACTION_TYPE = pa.struct(
    [
        ("kind", pa.string()),
        ("point", _POINT),
        ("end_point", _POINT),
        ("text", pa.string()),
        ("direction", pa.string()),
        ("error", pa.string()),
    ]
)

STEP_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("task_id", pa.string()),
        ("step_idx", pa.int32()),
        ("weight_version", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("behaviour_logprobs", pa.list_(pa.float32())),
        ("entropy", pa.list_(pa.float32())),
        ("token_versions", pa.list_(pa.int64())),
        ("num_images", pa.int16()),
        ("response_text", pa.string()),
        ("action", ACTION_TYPE),
        ("screenshot", pa.binary()),
    ]
)
"""One row per step; trajectory fields live in the metadata key `TRAJECTORY_META_KEY`."""

TRAJECTORY_META_KEY = b"dart_ray.trajectory"
OPTIONAL_STEP_COLUMNS = frozenset({"token_versions"})
"""Columns added since blobs were first written: a blob without them still reads."""
_NUMBER_LISTS = {
    name: STEP_SCHEMA.field(name).type
    for name in ("prompt_ids", "response_ids", "behaviour_logprobs", "entropy", "token_versions")
}
"""The per-token columns of a step: read as views of the blob's buffers (`ArraySeq`)."""
_STEP_SCALARS = (
    "step_idx",
    "weight_version",
    "num_images",
    "response_text",
    "action",
    "screenshot",
)
"""The other step columns: one Python value per step."""

SAMPLE_SCHEMA = pa.schema(
    [
        ("trajectory_id", pa.string()),
        ("task_id", pa.string()),
        ("step_idx", pa.int32()),
        ("weight_version", pa.int64()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("behaviour_logprobs", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("advantage", pa.float32()),
        ("images", pa.list_(pa.binary())),
        ("token_versions", pa.list_(pa.int64())),
    ]
)
"""One row per step sample, as the curator packs them for a trainer rank."""


def _point(p: tuple[float, float] | None) -> dict[str, float] | None:
    return None if p is None else {"x": float(p[0]), "y": float(p[1])}


def _unpoint(d: dict[str, float] | None) -> tuple[float, float] | None:
    return None if d is None else (d["x"], d["y"])


def _action_to_dict(a: Action) -> dict[str, Any]:
    return {
        "kind": a.kind.value,
        "point": _point(a.point),
        "end_point": _point(a.end_point),
        "text": a.text,
        "direction": a.direction,
        "error": a.error,
    }


def _action_from_dict(d: dict[str, Any]) -> Action:
    return Action(
        kind=ActionKind(d["kind"]),
        point=_unpoint(d["point"]),
        end_point=_unpoint(d["end_point"]),
        text=d["text"],
        direction=d["direction"],
        error=d["error"],
    )


def _trajectory_meta(t: Trajectory) -> dict[str, Any]:
    return {
        "trajectory_id": t.trajectory_id,
        "run_id": t.run_id,
        "task": {
            "task_id": t.task.task_id,
            "instruction": t.task.instruction,
            "env": t.task.env,
            "config": t.task.config,
            "split": t.task.split,
        },
        "reward": t.reward,
        "status": t.status.value,
        "trace_id": t.trace_id,
        "group_id": t.group_id,
        "group_size": t.group_size,
        "start_version": t.start_version,
        "started_at": t.started_at,
        "finished_at": t.finished_at,
        "error": t.error,
    }


def trajectory_to_table(t: Trajectory) -> pa.Table:
    """The Arrow form of a trajectory: `STEP_SCHEMA` rows plus the trajectory in metadata.

    Number lists are built column by column (`list_array`): a read-back step's views are
    copied buffer by buffer, a generation's tuples converted in one pass."""
    steps = t.steps
    cols: dict[str, Any] = {
        "trajectory_id": [t.trajectory_id] * len(steps),
        "task_id": [t.task.task_id] * len(steps),
        "step_idx": [s.step_idx for s in steps],
        "weight_version": [s.weight_version for s in steps],
        **{
            name: list_array([getattr(s, name) for s in steps], list_type)
            for name, list_type in _NUMBER_LISTS.items()
        },
        "num_images": [s.num_images for s in steps],
        "response_text": [s.response_text for s in steps],
        "action": [_action_to_dict(s.action) for s in steps],
        "screenshot": [s.screenshot for s in steps],
    }
    meta = {TRAJECTORY_META_KEY: json.dumps(_trajectory_meta(t)).encode()}
    return pa.Table.from_pydict(cols, schema=STEP_SCHEMA.with_metadata(meta))


def trajectory_from_table(table: pa.Table) -> Trajectory:
    """Inverse of `trajectory_to_table`; raises ValueError naming what is missing."""
    meta = table.schema.metadata or {}
    if TRAJECTORY_META_KEY not in meta:
        raise ValueError(f"not a dart-ray trajectory table: no {TRAJECTORY_META_KEY!r} metadata")
    missing = set(STEP_SCHEMA.names) - set(table.schema.names) - OPTIONAL_STEP_COLUMNS
    if missing:
        raise ValueError(f"trajectory table lacks columns {sorted(missing)}")
    m = json.loads(meta[TRAJECTORY_META_KEY])
    n = table.num_rows
    lists = {
        name: list_views(table.column(name)) if name in table.schema.names else [()] * n
        for name in _NUMBER_LISTS
    }
    scalars = {name: table.column(name).to_pylist() for name in _STEP_SCALARS}
    steps = tuple(
        Step(
            step_idx=scalars["step_idx"][i],
            prompt_ids=lists["prompt_ids"][i],
            response_ids=lists["response_ids"][i],
            behaviour_logprobs=lists["behaviour_logprobs"][i],
            entropy=lists["entropy"][i],
            token_versions=lists["token_versions"][i],
            num_images=scalars["num_images"][i],
            weight_version=scalars["weight_version"][i],
            response_text=scalars["response_text"][i],
            action=_action_from_dict(scalars["action"][i]),
            screenshot=scalars["screenshot"][i],
        )
        for i in range(n)
    )
    task = m["task"]
    return Trajectory(
        trajectory_id=m["trajectory_id"],
        run_id=m["run_id"],
        task=Task(
            task_id=task["task_id"],
            instruction=task["instruction"],
            env=task["env"],
            config=task["config"],
            split=task["split"],
        ),
        steps=steps,
        reward=m["reward"],
        status=Status(m["status"]),
        trace_id=m["trace_id"],
        group_id=m["group_id"],
        group_size=m["group_size"],
        start_version=m["start_version"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        error=m["error"],
    )
