"""The environment contract every GUI environment of dart-ray implements, and its registry.

An environment is gym-like and synchronous: `reset(task) -> Observation`, `step(action) ->
StepResult`, `evaluate() -> float`, `close()`. One `EnvSession` actor owns one environment and
is the only caller, so environments need no locking.

Failures are part of the contract, not an afterthought. GUI sessions crash: a browser dies, an X
application is killed, a desktop server stops answering. An environment that detects such a
failure raises `EnvCrashed`; the session then recreates the environment and reports the episode
in progress as ABORTED (never as a failed episode with reward 0, which would teach the policy
that the task is hard when the machine was broken). A task the environment cannot accept
raises `EnvInputError`, which names the problem and leaves the environment usable.

An action the environment cannot carry out (a click without a point, a key it cannot press,
text over `env.max_type_chars`) is the model's mistake, and is judged as the model's: `step`
returns `invalid_step(observation, reason)`, a step in which nothing happened and whose
`info` says `invalid action: <reason>`; the episode records the reason on its step and goes
on. Never an exception: one that reached the rollouter would end it, and an abort would be
retried as if the machine had failed.

Observations carry PNG screenshots, but PNG encoding costs more than a whole MiniDesk step, so
`FrameObservation` keeps the raw frame and encodes only when `.screenshot` is first read (or when
the observation crosses a process boundary, where it travels as a plain `Observation`).

Environment kinds are import paths; a few short names are registered for the built-in ones, and
`register` adds more (the extension point STYLE.md asks for).
"""

from __future__ import annotations

import importlib
import io
import re
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from PIL import Image

from dart_ray.records import Action, ActionKind, Observation, Task

if TYPE_CHECKING:
    from dart_ray.config import EnvConfig


class EnvError(RuntimeError):
    """Base class of the errors an environment raises on purpose."""


class EnvCrashed(EnvError):
    """The environment's machinery failed (process died, server silent); recreate it."""


class EnvInputError(EnvError, ValueError):
    """A task or an action the environment cannot accept; the environment stays usable."""


class InvalidAction(EnvInputError):
    """An action the environment cannot carry out; `str(e)` is the reason.

    Environments raise it inside `step` and answer with `invalid_step` (see the module
    docstring); the episode treats one that escapes `step` (any `EnvInputError` from a step:
    the contract's word for an action the env refuses) the same way."""


class NoEpisode(EnvInputError):
    """`step` or `evaluate` with no episode in progress: never reset, the last episode was
    aborted, or the session's process was restarted in between (which loses the episode, so
    the episode treats it as an environment failure)."""


class EnvAborted(EnvError):
    """The episode in progress is lost to an environment failure (raised by EnvSession).

    Record the trajectory as `Status.ABORTED` and retry the task on a fresh session; never
    score it. `detail` holds the tail of the underlying traceback, when there was one.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.detail))


@dataclass(frozen=True, slots=True)
class StepResult:
    """What one step returns: the next observation, whether the episode ended, and details."""

    observation: Observation
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    """Environment-specific details (e.g. `{"event": "clicked", "target": "ok"}`); JSON-able."""


INVALID_EVENT = "invalid"
"""`info["event"]` of a step whose action the environment could not carry out."""


def invalid_step(observation: Observation, reason: str) -> StepResult:
    """The step of an action the environment cannot carry out: nothing happened, the episode
    goes on, and `info` is `{"event": "invalid", "error": "invalid action: <reason>"}`."""
    return StepResult(observation, False, {"event": INVALID_EVENT, "error": invalid_reason(reason)})


def invalid_reason(reason: str) -> str:
    """`invalid action: <reason>` (once, however often it is wrapped)."""
    return reason if reason.startswith("invalid action: ") else f"invalid action: {reason}"


def check_type_length(action: Action, max_chars: int) -> None:
    """InvalidAction for a `type` whose content is longer than `max_chars` (`env.max_type_chars`):
    typing it would outlast the step deadline, and the timeout would count as the machine's
    failure."""
    n = len(action.text or "") if action.kind is ActionKind.TYPE else 0
    if n > max_chars:
        raise InvalidAction(f"type content has {n} characters, more than {max_chars}")


_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_BANNER = re.compile(r"^ray::\S+ \(pid=")  # Ray's first line: which task or actor call failed
_TRACE_STARTS = ("Traceback (most recent call last)", "Stacktrace:")


def error_message(e: BaseException, limit: int = 500) -> str:
    """What an error says, for a record (a trajectory's `error`, a session's last error).

    A `RayTaskError` (what `ray.get` raises for an exception in an actor) is an instance of
    the exception raised there too, but its text is Ray's coloured banner and the remote
    traceback: the message is that of its `cause`. Also drops ANSI colour codes, a traceback
    after the message (Python's, or the browser's `Stacktrace:` in Selenium's errors), keeps
    only the last line of a remote traceback without a cause, joins the rest on one line and
    cuts it at `limit` characters."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException) and cause is not e:
        e = cause
    lines = [line.strip() for line in _ANSI.sub("", str(e)).splitlines() if line.strip()]
    cut = next((i for i, line in enumerate(lines) if line.startswith(_TRACE_STARTS)), None)
    lines = [line for line in lines[:cut] if not _BANNER.match(line) and set(line) != {"^"}]
    if any(line.startswith('File "') for line in lines):  # a traceback: the error is last
        lines = lines[-1:]
    text = " ".join(lines) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def encode_png(image: Image.Image, compress_level: int = 1) -> bytes:
    """PNG bytes of an image. Level 1 is ~3x faster than the default 6 for ~10% more bytes."""
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=compress_level)
    return buf.getvalue()


class FrameObservation(Observation):
    """An `Observation` whose PNG is encoded from the raw frame on first access.

    It is an `Observation` (isinstance holds, every field reads the same), so consumers need not
    know. Pickling (Ray, multiprocessing) sends a plain `Observation` with the encoded PNG.
    """

    __slots__ = ("_frame", "_png")

    def __init__(
        self, frame: Image.Image, text: str = "", accessibility: str | None = None
    ) -> None:
        object.__setattr__(self, "width", frame.width)
        object.__setattr__(self, "height", frame.height)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "accessibility", accessibility)
        object.__setattr__(self, "_frame", frame)
        object.__setattr__(self, "_png", None)

    @property  # type: ignore[override]
    def screenshot(self) -> bytes:  # shadows the parent's slot on purpose
        if self._png is None:
            object.__setattr__(self, "_png", encode_png(self._frame))
        return self._png  # type: ignore[return-value]

    @property
    def frame(self) -> Image.Image:
        """The raw RGB frame (shared with the environment: copy before drawing on it)."""
        return self._frame

    @property
    def encoded(self) -> bool:
        return self._png is not None

    def materialize(self) -> Observation:
        """A plain `Observation` with the PNG bytes."""
        return Observation(self.screenshot, self.width, self.height, self.text, self.accessibility)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            Observation,
            (self.screenshot, self.width, self.height, self.text, self.accessibility),
        )


def observation_image(obs: Observation) -> Image.Image:
    """The RGB image of an observation, without a PNG round trip when the frame is at hand."""
    if isinstance(obs, FrameObservation):
        return obs.frame
    return Image.open(io.BytesIO(obs.screenshot)).convert("RGB")


class Env(ABC):
    """A GUI environment. Construct with the `env` config section; then reset/step/evaluate."""

    @abstractmethod
    def reset(self, task: Task) -> Observation:
        """Restore a clean state, set the task up, return the first observation."""

    @abstractmethod
    def step(self, action: Action) -> StepResult:
        """Carry out one action (screen pixels) and return what followed."""

    @abstractmethod
    def evaluate(self) -> float:
        """Score the current episode with the environment's own rule (usually 0.0 or 1.0)."""

    @abstractmethod
    def close(self) -> None:
        """Release every process and resource; safe to call twice and after a crash."""

    def healthy(self) -> bool:
        """Cheap liveness probe (a browser still there, a server answering)."""
        return True

    def processes(self) -> list[int]:
        """PIDs of the processes this env started (their trees count as its memory)."""
        return []

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, str] = {
    "minidesk": "dart_ray.envs.minidesk.env:MiniDeskEnv",
    "miniwob": "dart_ray.envs.miniwob.env:MiniWobEnv",
    "osworld": "dart_ray.envs.osworld.env:OSWorldEnv",
    "desktop": "dart_ray.envs.osworld.env:LocalDesktopEnv",
}


def register(name: str, path: str) -> None:
    """Register (or replace) a short name for an environment class `pkg.mod:Class`."""
    if ":" not in path:
        raise ValueError(f"environment path {path!r} must look like 'pkg.module:Class'")
    _REGISTRY[name] = path


def registered() -> dict[str, str]:
    return dict(_REGISTRY)


def resolve(kind: str) -> type[Env]:
    """The class for a registered name or an import path `pkg.mod:Class`."""
    path = _REGISTRY.get(kind, kind)
    module_name, sep, attr = path.partition(":")
    if not sep or not attr:
        raise EnvInputError(
            f"unknown environment kind {kind!r}: not one of {sorted(_REGISTRY)} "
            "and not an import path 'pkg.module:Class'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EnvInputError(f"environment kind {kind!r}: cannot import {module_name} ({e})") from e
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Env)):
        raise EnvInputError(f"environment kind {kind!r}: {path} is not an Env subclass")
    return cls


_building = threading.local()


def building_session() -> str | None:
    """The name of the session whose environment `make_env` is building on this thread (an
    environment that keys something on its session, like LatencyMiniDesk's random streams,
    reads it; several sessions may share one process)."""
    return getattr(_building, "session", None)


def make_env(config: EnvConfig, session: str | None = None) -> Env:
    """Build the environment the config names, for the session named `session`."""
    _building.session = session
    try:
        return resolve(config.kind)(config)  # type: ignore[call-arg]
    finally:
        _building.session = None
