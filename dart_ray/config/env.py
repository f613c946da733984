"""`[env]`: the environments the policy acts in, their session pool, and the options of each
kind (`[env.minidesk]`, `[env.miniwob]`, `[env.desktop]`)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from dart_ray.config.base import Section
from dart_ray.config.timing import EnvLatency


class MiniDeskOptions(Section):
    """MiniDesk, the synthetic desktop drawn with PIL (`env.kind = "minidesk"`)."""

    wallpaper: Literal["plain", "position"] = "plain"
    """`position`: a wallpaper whose red channel rises with x and green with y, shown through
    the window body, so a tiny model can learn to ground clicks from pixels alone."""
    button_colours: bool = False
    """Give each button a face colour fixed by its label (an icon, in effect), so a tiny model
    can tell buttons apart without reading their text; the label is still drawn on it."""
    placement: Literal["task", "flow", "scatter", "grid"] = "task"
    """Widget placement: `flow` (rows, top to bottom), `scatter` (seeded random positions),
    `grid` (seeded, each widget centred on a 28 px cell: Qwen2.5-VL's merged patch on an
    unscaled screen, so click targets are one per image token) or `task` (what each task file
    says)."""
    jitter: int = Field(default=0, ge=0, le=13)
    """`grid` placement: move each widget off its cell's centre by a seeded offset of up to
    this many pixels across and half as many down, so that positions vary by the pixel and
    not only by the cell (and screens by content: docs/LEARNING.md, "Suites"). A widget
    wider than twice this and taller than it still covers its cell's centre. 0: centred."""
    encode_png: bool = False
    """Encode every screenshot to PNG inside step(). Off: encode lazily on first read."""


class MiniWobOptions(Section):
    """MiniWoB++ in headless Chromium (`env.kind = "miniwob"`, extra `browser`)."""

    episode_max_time_s: float = Field(default=600.0, gt=0)
    """MiniWoB's per-episode wall clock (its own default is 10 s, too short for a model
    policy); the task's reward shrinks with elapsed time over this clock."""
    chrome_binary: Path | None = None
    """Chromium binary; unset: $MINIWOB_CHROME_BINARY, else the first of chromium,
    chromium-headless-shell, google-chrome on PATH."""
    chromedriver: Path | None = None
    """chromedriver binary; unset: $MINIWOB_CHROMEDRIVER, else chromedriver on PATH."""
    scale: float = Field(default=1.0, gt=0)
    """Screenshot scale: MiniWoB's task area is 160x210 px; 2.0 shows the policy 320x420 (and
    its click points are divided by 2 on the way back to the page)."""
    raw_reward: bool = False
    """Score an episode by the task's raw reward (1 solved, -1 failed; a few tasks give
    partial credit) instead of MiniWoB's reward scaled by 1 - elapsed / episode_max_time_s.
    For RL: GRPO standardises the rewards within a group, and the scaling makes them differ
    by the engine's latency alone, so an all-success or all-fail group would train on noise."""


class DesktopOptions(Section):
    """A real X desktop behind the OSWorld in-VM protocol (`env.kind = "desktop" | "osworld"`)."""

    server_url: str | None = None
    """OSWorld-protocol server to talk to (`http://127.0.0.1:5000`); unset with kind
    `desktop`: start our own server on a private Xvfb display."""
    pool_url: str | None = None
    """GUI-Docker-Env emulator pool (`/start_emulator`, `/stop_emulator`); when set, each
    session asks it for a desktop instead of using server_url."""
    token_env: str | None = None
    """Environment variable holding the bearer token for the server and the pool."""
    token_file: Path | None = None
    """File whose first line is the bearer token (wins over token_env)."""
    apps: list[str] | None = None
    """Applications (e.g. `["xterm"]`) started fresh after every reset, before the task's own
    setup steps; a task's `apps` wins. Unset: what the server was started with (none for ours)."""
    window_manager: str = "openbox"
    """Window manager for our local desktop."""
    osworld_profile: bool = False
    """Run our local desktop as OSWorld's `user` with HOME /home/user, Ctrl+Alt+T for a
    terminal, sudo inside (`scripts/install-osworld-desktop.sh` installs it; as root or as
    `user` only), so OSWorld's task files run unmodified."""
    confine: bool | None = None
    """Run our local desktop in a mount namespace whose system folders (/etc, /usr, /var,
    /opt, /srv, /root, /home) are overlays, started afresh at every reset: what an episode
    changes there (through the OSWorld profile's passwordless `sudo`: packages, system files,
    users) is gone at the next episode and never reaches the machine, and every process the
    episode started (daemons through `sudo` or `setsid` too) is ended. Needs root. Unset: on
    with `osworld_profile` (whose user has sudo), off otherwise (docs/SECURITY.md)."""
    request_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds one HTTP request to the server may take."""
    accessibility: bool = True
    """Put the accessibility tree (`/accessibility`) into every observation."""
    settle_s: float = Field(default=0.3, ge=0)
    """Pause after each action before the screenshot, for the application to redraw."""
    evaluator: Literal["ours", "osworld"] = "ours"
    """Who sets a task up and scores its end state. `osworld`, for OSWorld's tasks (every
    OSWorld config sets it): OSWorld's own SetupController runs the task's `config` steps
    and `DesktopEnv.evaluate` scores it with its getters and metrics (PyPI `desktop-env`), in
    a worker process of `osworld_venv` (`make osworld-venv`) through OSWorld's own client;
    every metric of OSWorld's 369 tasks, less those the venv leaves out
    (docs/ENVIRONMENTS.md). `ours`, for our own desktop suite (`dart_ray.envs.desktop.suite`):
    our set-up runner and `dart_ray.envs.osworld.ours`, in this process, with the few getters
    and metrics that suite uses; it needs no second venv."""
    osworld_venv: Path = Path(".venv-osworld")
    """The venv OSWorld's evaluator runs in (`scripts/setup-osworld-venv.sh` builds it).
    Absolute on a cluster (cluster/Dockerfile builds /home/ray/dart-ray/.venv-osworld): a
    job's working directory is a temporary copy that venvs do not travel with."""
    password_env: str | None = None
    """Environment variable holding the desktop user's password, which OSWorld's set-up puts
    for `{CLIENT_PASSWORD}` in a task's commands (`echo {CLIENT_PASSWORD} | sudo -S ...`).
    Unset: empty, which is enough for the OSWorld profile's user (passwordless sudo)."""
    evaluator_workers: int = Field(default=2, ge=0)
    """With `evaluator = "osworld"` in a run's sessions: worker processes of OSWorld's
    evaluator (~350 MB each) that all sessions of a node share, held by one Ray actor per node
    (`actors/osworld_evaluator.py`); a session waits for a free one to set up or score a task.
    0: a worker per session, in the session's own process (what an environment outside Ray,
    as in `dart-ray eval` without `--ray`, always does)."""
    osworld_cache_dir: Path | None = None
    """OSWorld's cache folder (`<dir>/<task id>/<file>`): files a task's `cloud_file` getter
    names that are already here are read instead of downloaded, so such tasks score offline.
    Unset: a temporary folder per env; those tasks then fail, naming the task and getter.
    Our set-up reads it too: a `download` step's file cached as OSWorld caches it
    (`<dir>/<task id>/<uuid5(NAMESPACE_URL, url)>_<file name>`) is uploaded instead of
    downloaded, and `update_browse_history` keeps its empty History database there."""
    chromium_port: int = Field(default=9222, ge=1, le=65535)
    """The desktop's Chrome DevTools port (OSWorld's `chromium_port`: its tasks start Chrome on
    1337 and forward 9222 to it), for the Chrome setup steps and OSWorld's Chrome getters."""


class EnvConfig(Section):
    kind: str = "minidesk"
    """Environment kind: a registered name or an import path `pkg.mod:Class`."""
    tasks: Path | None = None
    """JSONL task file to train on; unset means the environment's built-in training split."""
    validation_tasks: Path | None = None
    """JSONL task file every choice is made on (a warm start's stopping point,
    hyper-parameters, an experiment's arms), disjoint by content from `tasks` and
    `heldout_tasks`; unset means the environment's built-in validation split."""
    heldout_tasks: Path | None = None
    """JSONL task file a reported number is measured on, once (the run's before/after
    evaluation, `dart-ray eval`'s default, an experiment's lift); unset means the
    environment's built-in held-out split."""
    ood_tasks: Path | None = None
    """JSONL task file held out by construction: tasks whose instruction names a target no
    other split names (MiniDesk's `HELD_OUT_WORDS`), reported apart from `heldout_tasks`
    (`dart-ray experiment`, `dart-ray eval --suite ood`). Unset: no such split."""
    families: tuple[str, ...] = ()
    """Keep only tasks whose `config.family` is one of these (empty: all)."""
    tiers: tuple[int, ...] = ()
    """Keep only tasks whose `config.tier` is one of these (empty: all)."""
    task_limit: int | None = Field(default=None, ge=1)
    """Use only the first N tasks of each split after filtering (unset: all)."""
    num_sessions: int = Field(default=4, ge=1)
    """EnvSession actors in the pool at the start."""
    max_sessions: int | None = Field(default=None, ge=1)
    """Grow the pool up to this many sessions as the cluster's `env.resource` grows (one
    session per unit, e.g. environment nodes the autoscaler adds). Unset: the pool stays at
    num_sessions."""
    grow_interval_s: float = Field(default=30.0, gt=0)
    """How often a growing pool reads the cluster's resources."""
    screen_width: int = Field(default=320, ge=28)
    """Screen width in pixels."""
    screen_height: int = Field(default=240, ge=28)
    """Screen height in pixels."""
    reset_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds a reset may take before the session is declared broken."""
    step_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds a step may take before the session is declared broken."""
    wait_s: float = Field(default=5.0, ge=0)
    """Seconds a `wait()` action pauses before the next screenshot, for a page or an app to
    finish what it started: the 5 s the UI-TARS prompt promises the model (`wait() # pause
    5 s`). MiniWoB++ and the desktops pause; MiniDesk does not (nothing there changes with
    time, so a pause would only slow its rollouts). Must be shorter than step_timeout_s."""
    max_type_chars: int = Field(default=1000, ge=1)
    """Longest `type(content=...)` an environment types; a longer one is a failed step
    (`invalid action: ...`), the model's mistake. Typing is slow (MiniWoB++ ~1.5 ms a
    character, a desktop 5 ms or more), so what step_timeout_s allows bounds this: past the
    deadline the session would be rebuilt and the episode retried as the machine's failure."""
    num_cpus: float = Field(default=0.25, gt=0)
    """CPUs each EnvSession actor reserves (fractional is fine); an EnvHost reserves as much
    for all its sessions."""
    sessions_per_actor: int = Field(default=1, ge=1)
    """Sessions one actor holds. 1: an EnvSession actor each (a process per session: right
    for desktops and browsers that need a core each). More: EnvHost actors of this many
    sessions, which run their calls in threads; for pools of hundreds or thousands of
    sessions that wait on remote machines or on simulated latencies (the timing mode)."""
    resource: str | None = "env"
    """Custom Ray resource each session requests (1 unit per session); None to not request one."""
    fit_to_cluster: bool = False
    """When the cluster offers fewer units of `resource` than the session actors need, start as
    many sessions as it offers (said in one line) instead of failing with the numbers. With
    `max_sessions` the pool then grows back as nodes with the resource join."""
    minidesk: MiniDeskOptions = MiniDeskOptions()
    """Options of the MiniDesk synthetic environment."""
    miniwob: MiniWobOptions = MiniWobOptions()
    """Options of MiniWoB++ in Chromium."""
    desktop: DesktopOptions = DesktopOptions()
    """Options of the X desktop reached through the OSWorld protocol."""
    latency: EnvLatency | None = None
    """Latencies of `env.kind = "dart_ray.envs.latency:LatencyMiniDesk"` (MiniDesk behind
    OSWorld-shaped delays); the timing mode sets it from `[timing]`. Unset: its defaults."""

    @field_validator("max_sessions")
    @classmethod
    def _at_least_the_start(cls, v: int | None, info: ValidationInfo) -> int | None:
        start = info.data.get("num_sessions")
        if v is not None and start is not None and v < start:
            raise ValueError(f"must be at least env.num_sessions ({start})")
        return v

    @model_validator(mode="after")
    def _wait_within_a_step(self) -> EnvConfig:
        if self.wait_s >= self.step_timeout_s:
            raise ValueError(
                f"env.wait_s ({self.wait_s:g}) must be shorter than env.step_timeout_s "
                f"({self.step_timeout_s:g}): every wait() would abort its episode"
            )
        return self

    @field_validator("resource")
    @classmethod
    def _needed_to_grow(cls, v: str | None, info: ValidationInfo) -> str | None:
        if not v and info.data.get("max_sessions") is not None:
            raise ValueError("must be set when env.max_sessions is: the pool grows with it")
        return v
