"""The configuration tree: one pydantic model per part, loaded from TOML plus `key=value`.

Every field has a docstring (it becomes the field's description, which `dart-ray config
show --docs` and the configuration reference print). Validation happens once, at load,
before any process starts; errors name the dotted key and the offending value.

Secrets never live in the config. A field that needs one names where to read it: an
environment variable (`*_env`) or a file (`*_file`). The config is therefore safe to print
and to store in the `run` table; `redacted()` masks anything that still looks like a secret
(a password inside a DSN, say) as a second line of defence.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from dart_ray.masking import MASK, mask_text, remember


class ConfigError(ValueError):
    """A configuration problem, phrased for the person who wrote the config."""


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


class RunConfig(_Section):
    name: str = "tiny-cpu"
    """Human-readable experiment name; part of the generated run id."""
    run_id: str | None = None
    """Run id to use (or resume). Generated as `<name>-<timestamp>` when unset."""
    root_dir: Path = Path("runs")
    """Folder for run outputs (`<root_dir>/<run_id>/`) and the embedded SQLite log."""
    seed: int = 0
    """Seed for task sampling, environments and model initialisation."""
    mode: Literal["decoupled", "sync"] = "decoupled"
    """`decoupled`: rollout and training overlap (DART). `sync`: the synchronous baseline."""
    max_versions: int = Field(default=20, ge=1)
    """Stop after this many weight versions have been published."""
    max_minutes: float = Field(default=60.0, gt=0)
    """Wall-clock budget: training stops cleanly (a final durable version) when it runs out."""
    eval_tasks: int = Field(default=16, ge=0)
    """Held-out tasks played greedily before and after training for the report (0: skip)."""
    resume: bool = False
    """Continue `run_id` from its newest durable checkpoint and its unconsumed buffer."""

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", v):
            raise ValueError("must be 1-128 characters of letters, digits, '.', '_', '-'")
        return v


class MiniDeskOptions(_Section):
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
    encode_png: bool = False
    """Encode every screenshot to PNG inside step(). Off: encode lazily on first read."""


class MiniWobOptions(_Section):
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


class DesktopOptions(_Section):
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
    request_timeout_s: float = Field(default=30.0, gt=0)
    """Seconds one HTTP request to the server may take."""
    accessibility: bool = True
    """Put the accessibility tree (`/accessibility`) into every observation."""
    settle_s: float = Field(default=0.3, ge=0)
    """Pause after each action before the screenshot, for the application to redraw."""


class EnvConfig(_Section):
    kind: str = "minidesk"
    """Environment kind: a registered name or an import path `pkg.mod:Class`."""
    tasks: Path | None = None
    """JSONL task file to train on; unset means the environment's built-in training split."""
    heldout_tasks: Path | None = None
    """JSONL task file to evaluate on; unset means the environment's built-in held-out split."""
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
    num_cpus: float = Field(default=0.25, gt=0)
    """CPUs each EnvSession actor reserves (fractional is fine)."""
    resource: str | None = "env"
    """Custom Ray resource each session requests (1 unit per session); None to not request one."""
    minidesk: MiniDeskOptions = MiniDeskOptions()
    """Options of the MiniDesk synthetic environment."""
    miniwob: MiniWobOptions = MiniWobOptions()
    """Options of MiniWoB++ in Chromium."""
    desktop: DesktopOptions = DesktopOptions()
    """Options of the X desktop reached through the OSWorld protocol."""

    @field_validator("max_sessions")
    @classmethod
    def _at_least_the_start(cls, v: int | None, info: ValidationInfo) -> int | None:
        start = info.data.get("num_sessions")
        if v is not None and start is not None and v < start:
            raise ValueError(f"must be at least env.num_sessions ({start})")
        return v

    @field_validator("resource")
    @classmethod
    def _needed_to_grow(cls, v: str | None, info: ValidationInfo) -> str | None:
        if not v and info.data.get("max_sessions") is not None:
            raise ValueError("must be set when env.max_sessions is: the pool grows with it")
        return v


class PolicyConfig(_Section):
    model_path: Path | None = None
    """Local HF model directory (e.g. UI-TARS-1.5-7B). Unset: build the tiny model locally."""
    engine: Literal["hf", "vllm"] = "hf"
    """Inference engine: `hf` (transformers, CPU or GPU) or `vllm`."""
    replicas: int = Field(default=1, ge=1)
    """Policy server replicas (Ray Serve)."""
    temperature: float = Field(default=1.0, ge=0)
    """Sampling temperature (0 = greedy: a policy server's default for its HTTP route; a run
    refuses it, since RL learns from sampled tokens and their log-probs, which greedy
    decoding does not have; held-out evaluation is greedy by itself)."""
    top_k: int = Field(default=0, ge=0)
    """Sample among the k most likely tokens (0: all). The trainer scores the same truncated
    distribution."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Nucleus sampling mass (1: all). The trainer scores the same truncated distribution."""
    max_new_tokens: int = Field(default=64, ge=1)
    """Maximum response tokens per turn (DART-GUI: 500 on UI-TARS-7B)."""
    history_images: int = Field(default=1, ge=1)
    """Screenshots kept in the prompt (the newest k)."""
    history_turns: int = Field(default=5, ge=0)
    """Previous assistant turns kept in the prompt (the newest m)."""
    max_batch_size: int = Field(default=32, ge=1)
    """Largest batch the transformers engine forms from concurrent requests."""
    batch_wait_ms: float = Field(default=5.0, ge=0)
    """How long a request waits for others to join its batch."""
    http_host: str = "127.0.0.1"
    """Address the OpenAI-compatible HTTP route binds to; any but a loopback address needs
    auth_token_file or auth_token_env."""
    http_port: int = Field(default=8000, ge=1, le=65535)
    """Port of the HTTP route."""
    auth_token_env: str | None = None
    """Environment variable holding a bearer token the HTTP route requires (unset: none)."""
    auth_token_file: Path | None = None
    """File whose first line is the bearer token the HTTP route requires (wins over
    auth_token_env; the path must exist on every node that runs a replica)."""
    num_cpus: float = Field(default=1.0, gt=0)
    """CPUs each policy replica reserves (fractional is fine)."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs each policy replica reserves."""
    autoscaling: bool = False
    """Let Ray Serve scale replicas between min_replicas and max_replicas with the load."""
    min_replicas: int = Field(default=1, ge=0)
    """Fewest replicas when autoscaling."""
    max_replicas: int = Field(default=4, ge=1)
    """Most replicas when autoscaling."""
    target_ongoing_requests: float = Field(default=16.0, gt=0)
    """Requests in flight per replica that autoscaling aims for."""
    max_ongoing_requests: int = Field(default=64, ge=1)
    """Requests a replica accepts at once (at least max_batch_size for batching to fill)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations dtype of the engine."""
    allow_special_tokens: tuple[str, ...] = ()
    """Special tokens the policy may sample besides the end token (all others are suppressed;
    e.g. ["<|box_start|>", "<|box_end|>"] for UI-TARS-1.5-7B, which writes them)."""
    weights_load: Literal["share", "copy"] = "share"
    """transformers engine on CPU: `share` points the parameters at the weights in the object
    store (no copy; replicas on a node share them), `copy` copies them into the model."""
    update_timeout_s: float = Field(default=300.0, gt=0)
    """How long `update_weights` waits for every replica to load a new version."""
    vllm_max_model_len: int = Field(default=8192, ge=256)
    """vLLM: longest prompt plus response, in tokens."""
    vllm_kv_cache_mb: int = Field(default=512, ge=16)
    """vLLM: memory reserved for the KV cache, MiB (on GPU as on CPU: a fixed size, so a
    replica that shares its GPU with a train worker takes no more than it was given)."""
    vllm_logprobs_topk: int = Field(default=20, ge=-1)
    """vLLM: top log-probs per token used to estimate the entropy (a lower bound); -1 returns
    the whole vocabulary (exact entropy; affordable for small vocabularies only)."""

    @field_validator("vllm_logprobs_topk")
    @classmethod
    def _topk(cls, v: int) -> int:
        if v == 0:
            raise ValueError("must be -1 (whole vocabulary) or at least 1")
        return v

    @model_validator(mode="after")
    def _vllm_temperature(self) -> PolicyConfig:
        if self.engine == "vllm" and self.temperature > 2:
            raise ValueError(
                f"policy.temperature = {self.temperature}: vLLM samples at temperatures up to 2 "
                "(use policy.engine = 'hf' for hotter sampling)"
            )
        return self

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> PolicyConfig:
        if not is_loopback(self.http_host) and not (self.auth_token_env or self.auth_token_file):
            raise ValueError(
                f"policy.http_host = {self.http_host!r} serves beyond this machine: set "
                "policy.auth_token_file or policy.auth_token_env so the route needs a token"
            )
        return self


class RolloutConfig(_Section):
    in_flight: int = Field(default=8, ge=1)
    """Trajectories kept in flight at once by each rollouter (K)."""
    rollouters: int = Field(default=1, ge=1)
    """Rollouter actors; tasks and sessions are sharded between them, all feed one curator."""
    n_rollouts: int = Field(default=8, ge=1)
    """Default rollouts per task (the GRPO group size)."""
    max_steps: int = Field(default=8, ge=1)
    """Default step limit per episode (DART-GUI: 30 on OSWorld)."""
    max_retries: int = Field(default=2, ge=0)
    """Retries of an aborted trajectory on a fresh session before it is ENV_ERROR."""
    on_invalid_action: Literal["penalise", "end", "retry"] = "penalise"
    """Unparseable model output: count a no-op step (`penalise`), end the episode, or resample."""
    success_threshold: float = 1.0
    """A trajectory with reward >= this counts as a success (task statistics, replay)."""


class CurationConfig(_Section):
    group_size: int = Field(default=8, ge=1)
    """Trajectories per task group used for GRPO advantages."""
    min_group: int = Field(default=2, ge=1)
    """Smallest group trained when the group timeout passes."""
    group_timeout_s: float = Field(default=120.0, gt=0)
    """Seconds to wait for a full group before training a partial one."""
    group_abandon_s: float = Field(default=600.0, gt=0)
    """Seconds after which a group still below min_group is dropped (reason
    `group_incomplete`): its missing members are lost, and holding it would hold its rows."""
    max_held_rows: int | None = Field(default=None, ge=1)
    """Most rows the curator holds claimed but not yet handed to the trainer (its memory
    bound; the rest stay AVAILABLE in the log). None: (queue_depth + 1) x groups_per_step x
    group_size for curated steps, plus rollouters x in_flight x max(group_size, n_rollouts)
    for the groups still filling (at most that many are open at once, so a full group can
    always form)."""
    max_staleness: int = Field(default=2, ge=0)
    """Drop trajectories whose oldest step is more than this many versions behind."""
    success_replay: bool = True
    """Give an all-fail group the newest success of its task (DART-GUI's experience replay)."""
    drop_no_signal: bool = True
    """Drop groups whose rewards are all equal (zero advantage: no policy gradient). Off, they
    are trained anyway (only the KL term moves the weights): for pipeline tests."""
    entropy_top_fraction: float = Field(default=1.0, gt=0, le=1)
    """Keep this fraction of steps with the highest mean token entropy (1.0 keeps all)."""
    dynamic_rollouts: bool = True
    """Fewer rollouts for tasks the policy already solves (dynamic rollout budget)."""
    queue_depth: int = Field(default=2, ge=1)
    """Training steps queued before the curator stops claiming (backpressure)."""
    groups_per_step: int = Field(default=4, ge=1)
    """Trainable task groups packed into one optimizer step (DART-GUI: 6-8 tasks)."""
    lease_s: float = Field(default=600.0, gt=0)
    """Seconds a claim holds rows before they return to the pool unless acknowledged."""


class AlgoConfig(_Section):
    loss: Literal["ppo", "gspo"] = "ppo"
    """Token-level PPO clip or sequence-level GSPO."""
    eps_low: float = Field(default=0.1, gt=0)
    """Lower clip range (ratio >= 1 - eps_low)."""
    eps_high: float = Field(default=0.28, gt=0)
    """Upper clip range (ratio <= 1 + eps_high)."""
    dual_clip: float | None = Field(default=10.0, gt=1)
    """Dual-clip bound c for negative advantages (None disables)."""
    off_policy: Literal["token_tis", "token_mask", "seq_mask"] = "token_tis"
    """Correction of behaviour -> proximal policy (docs/TRAINING.md): `token_tis` weights each
    token by min(r, is_cap) with r = pi_prox / pi_behaviour; `token_mask` keeps r where it lies
    in [mask_low, mask_high] and drops the token otherwise (IcePop); `seq_mask` drops whole
    sequences whose geometric-mean ratio leaves the band and weights the rest by it."""
    is_cap: float = Field(default=1.0, gt=0)
    """Cap C of the truncated importance weight min(pi_prox / pi_behaviour, C) (`token_tis`)."""
    mask_low: float = Field(default=0.5, ge=0)
    """Lower edge of the ratio band of `token_mask` and `seq_mask`."""
    mask_high: float = Field(default=2.0, gt=0)
    """Upper edge of the ratio band of `token_mask` and `seq_mask`."""
    kl_beta: float = Field(default=0.0, ge=0)
    """KL coefficient to the frozen reference model; 0 disables the reference model."""
    advantage: Literal["trajectory", "step_weighted"] = "trajectory"
    """GRPO statistics per trajectory, or DART-GUI's step-count-weighted variant."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    """How token losses are reduced to one number."""

    @model_validator(mode="after")
    def _band(self) -> AlgoConfig:
        if not self.mask_low < 1 < self.mask_high:
            raise ValueError(
                f"the ratio band [algo.mask_low, algo.mask_high] = [{self.mask_low}, "
                f"{self.mask_high}] must contain 1 (on-policy tokens must be kept)"
            )
        return self


class TrainConfig(_Section):
    num_workers: int = Field(default=1, ge=1)
    """Ray Train workers (FSDP2 ranks)."""
    use_gpu: bool = False
    """Train on GPUs (NCCL) instead of CPUs (gloo)."""
    cpus_per_worker: float = Field(default=1.0, gt=0)
    """CPUs each train worker reserves."""
    gpus_per_worker: float = Field(default=1.0, gt=0)
    """GPUs each train worker reserves when use_gpu (a fraction shares a GPU with a policy
    replica, e.g. 0.5 and policy.num_gpus = 0.5 on a one-GPU machine)."""
    max_restarts: int = Field(default=3, ge=0)
    """Times the trainer is started again after a worker died (from the newest COMPLETED
    checkpoint, in a new trainer session); the run fails after that."""
    lr: float = Field(default=1e-4, ge=0)
    """AdamW learning rate (DART-GUI: 1e-6 on UI-TARS-7B). 0 is the control run: every part
    runs and every row is trained, but the weights never move (docs/LEARNING.md)."""
    weight_decay: float = Field(default=0.1, ge=0)
    """AdamW weight decay."""
    grad_clip: float = Field(default=2.0, gt=0)
    """Gradient norm clip."""
    tokens_per_rank: int = Field(default=8192, ge=1)
    """Token budget of one rank's micro-batch."""
    ppo_epochs: int = Field(default=1, ge=1)
    """Passes over each curated batch. With ppo_epochs x minibatches > 1 the batch takes
    several optimizer steps, and the clip (ratio to the proximal policy) bounds how far."""
    minibatches: int = Field(default=1, ge=1)
    """Optimizer steps per pass: the batch is split into this many parts."""
    sync_every: int = Field(default=1, ge=1)
    """Optimizer steps between weight publications."""
    save_every: int = Field(default=5, ge=1)
    """Published versions between durable checkpoints."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory."""


class StoreConfig(_Section):
    dsn: str | None = None
    """SQLAlchemy URL of the durable log, without a password (e.g.
    `mysql+pymysql://dart@db:3306/dart`). Unset: SQLite at `<run.root_dir>/dart-ray.sqlite`."""
    dsn_env: str | None = None
    """Environment variable holding the whole DSN (may include a password); wins over `dsn`."""
    password_env: str | None = "DART_RAY_DB_PASSWORD"
    """Environment variable with the database password (read only if set)."""
    password_file: Path | None = None
    """File whose first line is the database password (wins over `password_env`)."""
    blob_uri: str | None = None
    """Where trajectory Parquet files go: a folder or any pyarrow.fs URI (`s3://bucket/p`).
    Unset: `<run.root_dir>/blobs`."""
    pool_size: int = Field(default=5, ge=1)
    """Connections kept in the pool per process."""
    retries: int = Field(default=8, ge=0)
    """Retries of a statement on a transient error (server restart, deadlock, lock)."""
    retry_backoff_s: float = Field(default=0.25, gt=0)
    """First retry delay; doubles each retry, capped at 5 s."""
    reconnect_wait_s: float = Field(default=120.0, ge=0)
    """How long a part that Ray restarts (curator, rollouter, train worker) waits at start for
    a database that is down before it gives up (a restart of both at once must not kill the
    part for good). Commands (`dart-ray status`, ...) fail at once."""
    connect_timeout_s: float = Field(default=5.0, gt=0)
    """Seconds to wait for a connection to the server."""

    @field_validator("dsn")
    @classmethod
    def _no_password_in_dsn(cls, v: str | None) -> str | None:
        if v is None:
            return v
        try:
            url = make_url(v)
        except ArgumentError as e:
            raise ValueError(f"not a database URL ({e})") from None
        if url.password:
            raise ValueError(
                "contains a password; put it in the environment variable named by "
                "store.password_env or in store.password_file"
            )
        return v


class ClusterConfig(_Section):
    address: str | None = None
    """Ray cluster address (`auto`, `ray://host:10001`); unset starts a local Ray."""
    num_cpus: float | None = None
    """CPUs of a local Ray (unset: all); ignored when joining a cluster."""
    namespace: str = "dart-ray"
    """Ray namespace for the run's named actors."""
    dashboard_host: str = "127.0.0.1"
    """Where a local Ray's dashboard binds."""


class Config(_Section):
    """The whole tree. Build it with `load_config`."""

    run: RunConfig = RunConfig()
    env: EnvConfig = EnvConfig()
    policy: PolicyConfig = PolicyConfig()
    rollout: RolloutConfig = RolloutConfig()
    curation: CurationConfig = CurationConfig()
    algo: AlgoConfig = AlgoConfig()
    train: TrainConfig = TrainConfig()
    store: StoreConfig = StoreConfig()
    cluster: ClusterConfig = ClusterConfig()

    @model_validator(mode="after")
    def _rollouts_sample(self) -> Config:
        if self.policy.temperature == 0:
            raise ValueError(
                "policy.temperature = 0: rollouts must sample (temperature > 0): greedy tokens "
                "have no log-probs to learn from; held-out evaluation is greedy by itself"
            )
        return self

    def redacted(self) -> dict[str, Any]:
        """A JSON-able dict safe to print, log or store (secrets masked)."""
        return redact(self.model_dump(mode="json"))

    def redacted_yaml(self) -> str:
        """`redacted()` as YAML: what a checkpoint row keeps in `config_yaml`."""
        return str(yaml.safe_dump(self.redacted(), sort_keys=True))


# --------------------------------------------------------------------------- loading

_SECRET_KEY = re.compile(r"(password|passwd|secret|token|api_key|apikey)", re.I)
_SECRET_REFERENCE = re.compile(r"_(env|file)$")


def redact(obj: Any, key: str = "") -> Any:
    """Mask values under secret-looking keys, passwords inside URLs and every secret this
    process has read (`dart_ray.masking`), recursively.

    Keys ending in `_env`/`_file` name where a secret lives, not the secret, and stay.
    """
    if isinstance(obj, dict):
        return {k: redact(v, str(k)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v, key) for v in obj]
    if isinstance(obj, str):
        if _SECRET_KEY.search(key) and not _SECRET_REFERENCE.search(key) and obj:
            return MASK
        return mask_text(obj)
    return obj


def _parse_value(raw: str) -> Any:
    """A CLI value as TOML (numbers, booleans, arrays, quoted strings), else a bare string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def apply_override(tree: dict[str, Any], override: str) -> None:
    """Apply one `a.b.c=value` to a nested dict in place."""
    key, sep, raw = override.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {override!r}: expected key=value, e.g. algo.eps_high=0.2")
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {'.'.join(parts[: i + 1])} is not a section")
        node = child
    node[parts[-1]] = _parse_value(raw.strip())


def _format_validation_error(err: ValidationError, source: str, tree: dict[str, Any]) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            lines.append(f"  {loc}: unknown key")
            continue
        value = tree
        for p in e["loc"]:
            value = value.get(p) if isinstance(value, dict) else None  # type: ignore[assignment]
        msg = e["msg"].removeprefix("Value error, ")
        if isinstance(value, dict):  # a section's (or the tree's) rule: the message names its keys
            lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
            continue
        shown = MASK if _SECRET_KEY.search(loc) else redact(value, loc)
        lines.append(f"  {loc} = {shown!r}: {msg}")
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Load a TOML file (or the defaults), apply `key=value` overrides, validate."""
    tree: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            tree = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {p} is not valid TOML: {e}") from None
    for o in overrides or []:
        apply_override(tree, o)
    if overrides:
        source += " + overrides"
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source, tree)) from None


def read_secret(env: str | None, file: Path | None) -> str | None:
    """A secret from a file (first line) or an environment variable; None if neither is set.

    The secret is remembered for masking (`dart_ray.masking`): this process never logs it.
    """
    secret = None
    if file is not None:
        try:
            lines = file.read_text().splitlines()
        except OSError as e:
            raise ConfigError(f"cannot read secret file {file}: {e.strerror}") from None
        secret = lines[0].strip() if lines else ""
    elif env:
        secret = os.environ.get(env)
    remember(secret)
    return secret


def field_docs(model: type[BaseModel] = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, description) for every leaf field, for docs and `--docs`."""
    rows: list[tuple[str, str, str]] = []
    for name, f in model.model_fields.items():
        ann = f.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows.extend(field_docs(ann, key + "."))
        else:
            d = f.default
            shown = repr(str(d)) if isinstance(d, Path) else repr(d)
            rows.append((key, shown, (f.description or "").replace("\n", " ")))
    return rows


def reference_markdown() -> str:
    """docs/CONFIGURATION.md, generated from the field docstrings (a test keeps it current)."""
    lines = [
        "# Configuration reference",
        "",
        "Generated from the docstrings in `dart_ray/config.py` by",
        "`dart-ray config show --markdown > docs/CONFIGURATION.md`; do not edit by hand.",
        "",
        "Set a key in a TOML file under its section (`[algo]` / `eps_high = 0.2`) or on the",
        "command line as `algo.eps_high=0.2` (values in TOML syntax).",
    ]
    section = None
    for key, default, doc in field_docs():
        sec = key.split(".", 1)[0]
        if sec != section:
            section = sec
            lines += ["", f"## `[{sec}]`", "", "| key | default | meaning |", "|---|---|---|"]
        cell = doc.replace("|", r"\|")
        lines.append(f"| `{key}` | `{default}` | {cell} |")
    return "\n".join(lines) + "\n"
