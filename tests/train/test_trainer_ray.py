"""A 2-worker FSDP2 run on CPU through Ray Train: versions reach the policy server, the
generations change, rows are acknowledged once, and a resumed trainer keeps counting up."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer

from actors.control import RunControl
from actors.curator import Curator, StepInfo, settings_from_config
from dart_ray.config import Config, load_config
from dart_ray.data.curator import CuratorCore, TrainStep
from dart_ray.engines.base import SamplingParams
from dart_ray.engines.hf import HFEngine
from dart_ray.store import open_store
from dart_ray.store.audit import audit
from dart_ray.store.db import RowState
from dart_ray.train.checkpointing import TrainerState, read_trainer_state
from dart_ray.train.job import TrainJob
from dart_ray.train.resume import resume_from_durable, resume_point
from dart_ray.train.worker import train_loop_per_worker
from serve_apps.policy import run_policy
from tests.policy_helpers import png, request
from tests.train.rollouts import log_group, policy_trajectories

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]
NS = "dart-ray-tests"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


def fit(cfg: Config, job: TrainJob, tmp: Path, name: str) -> None:
    TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"job": job},
        scaling_config=ScalingConfig(
            num_workers=cfg.train.num_workers,
            resources_per_worker={"CPU": cfg.train.cpus_per_worker},
        ),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(storage_path=str(tmp / "ray_train"), name=name),
    ).fit()


def test_fsdp_trainer_publishes_versions_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    overrides = [
        f"run.root_dir={tmp_path}",
        "run.max_versions=3",
        "train.num_workers=2",
        "train.cpus_per_worker=0.4",
        "train.lr=3e-3",
        "train.save_every=2",
        "curation.group_size=4",
        "curation.groups_per_step=1",
        # the groups are all logged at version 0 and trained up to version 4: publishing and
        # resuming are under test, not the staleness bound (which would drop the last group)
        "curation.max_staleness=10",
        "policy.num_cpus=0.3",
        "policy.http_port=8123",
    ]
    cfg = load_config(None, overrides)
    store = open_store(cfg, init=True)
    engine = HFEngine(tiny_model_dir)
    for k in range(4):
        log_group(store, policy_trajectories(engine, "run-t", f"t{k}", 0, [1.0, 0.0, 0.0, 1.0]))
    handle = run_policy(cfg.policy, tiny_model_dir, name="policy-train", route_prefix="/train")
    probe = request("click the red square", (png((200, 30, 30), box=20),), GREEDY)
    before = handle.generate.remote(probe).result()
    # keep the handles: a named actor without a live handle is collected
    curator = Curator.options(name="curator-t", namespace=NS).remote(cfg, "run-t", 2, 0.1)
    control = RunControl.options(name="control-t", namespace=NS).remote()
    job = TrainJob(
        config=cfg,
        run_id="run-t",
        model_dir=str(tiny_model_dir),
        run_dir=str(tmp_path),
        curator="curator-t",
        policy_app="policy-train",
        control="control-t",
        namespace=NS,
    )
    fit(cfg, job, tmp_path, "first")

    after = handle.generate.remote(probe).result()
    assert (before.weight_version, after.weight_version) == (0, 3)
    assert after.response_ids != before.response_ids  # the weights moved
    assert handle.health.remote().result()["version"] == 3
    cps = store.checkpoints.list("run-t")
    assert [(c.version_num, c.status) for c in cps] == [
        (1, "COMPLETED"),
        (2, "COMPLETED"),
        (3, "COMPLETED"),
    ]
    # save_every=2, and the last version is always made durable: files for v2 and v3
    assert [bool(c.path) for c in cps] == [False, True, True]
    assert Path(cps[1].path or "", "model.safetensors").is_file()
    # each durable checkpoint records the rows it trained since the previous one (lineage)
    lineage = [read_trainer_state(Path(c.path)).rows for c in cps[1:]]  # type: ignore[arg-type]
    assert [len(rows) for rows in lineage] == [8, 4] and not set(lineage[0]) & set(lineage[1])
    # ... and which weights trained each of them (the audit's staleness check): steps 0, 1, 2
    # by versions 0, 1, 2; the rows are version 0's, so their lags are 0, 1 and 2
    states = [read_trainer_state(Path(c.path)) for c in cps[1:]]  # type: ignore[arg-type]
    assert [sorted(st.trained_at) for st in states] == [[0, 1], [2]]
    assert audit(store.engine, "run-t").trained_lags == {0: 4, 1: 4, 2: 4}
    # rows are acknowledged once their weights are durable: 3 steps x 4 rows, once each
    assert store.log.buffer("run-t") == {(0, RowState.CONSUMED): 12, (0, RowState.CLAIMED): 4}

    # Resume from the durable checkpoint: it continues at step 3 and version 4.
    path, start = resume_point(store, "run-t")
    assert (Path(path).name, start) == ("v3", TrainerState(step=3, version=3))
    cfg2 = load_config(None, [*overrides[1:], f"run.root_dir={tmp_path}", "run.max_versions=4"])
    job2 = TrainJob(**{**job.__dict__, "config": cfg2, "model_dir": path, "start": start})
    fit(cfg2, job2, tmp_path, "resumed")
    assert handle.health.remote().result()["version"] == 4
    assert [c.version_num for c in store.checkpoints.list("run-t")] == [1, 2, 3, 4]
    assert store.log.buffer("run-t") == {(0, RowState.CONSUMED): 16}

    # A trainer that published v5 (max_versions=5) and died writing its files: the resumed
    # trainer starts from v4's files with its counter at 5 (v5's weights are gone: DISCARDED),
    # publishes the weights it holds as v6 before its first step, so the replicas stop
    # sampling from v5's, and trains on to a durable v7 (before, it took 5 >= 5 as the end and
    # the run finished on weights that exist nowhere).
    lost = store.checkpoints.create("run-t", 5, source="train")
    store.checkpoints.start(lost)
    log_group(store, policy_trajectories(engine, "run-t", "t4", 0, [1.0, 0.0, 0.0, 1.0]))
    path, start = resume_from_durable(store, "run-t")
    assert (Path(path).name, start) == ("v4", TrainerState(step=4, version=5, durable_version=4))
    cfg3 = load_config(None, [*overrides[1:], f"run.root_dir={tmp_path}", "run.max_versions=5"])
    job3 = TrainJob(**{**job.__dict__, "config": cfg3, "model_dir": path, "start": start})
    fit(cfg3, job3, tmp_path, "resumed-again")
    assert handle.health.remote().result()["version"] == 7
    cps = store.checkpoints.list("run-t")
    assert [(c.version_num, c.status, bool(c.path)) for c in cps[4:]] == [
        (5, "DISCARDED", False),
        (6, "COMPLETED", False),  # published at start: v4's weights
        (7, "COMPLETED", True),
    ]
    for actor in (curator, control):
        ray.kill(actor)
    from ray import serve

    serve.delete("policy-train")
    store.dispose()


def test_leases_outlive_an_optimizer_step_longer_than_the_lease(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Leases of 1.5 s; each optimizer step takes 3 s (the timing mode's simulated step: a 7B
    step, a publish or a checkpoint save can each outlast a lease). The trainer's heartbeat
    thread renews the held rows throughout, so both steps train and every row is
    acknowledged once. Before, leases were renewed only between phases: the renewal after
    the first step found its rows gone (LeaseLostError) and the trainer died."""
    overrides = [
        f"run.root_dir={tmp_path}",
        "run.max_versions=2",
        "train.save_every=2",
        "curation.group_size=4",
        "curation.groups_per_step=1",
        "curation.lease_s=1.5",
        "timing.enabled=true",
        "timing.train_overhead_s=3.0",
        "timing.train_tokens_per_s=1e12",
        "policy.num_cpus=0.3",
        "policy.http_port=8123",
    ]
    cfg = load_config(None, overrides)
    store = open_store(cfg, init=True)
    engine = HFEngine(tiny_model_dir)
    for k in range(2):
        log_group(store, policy_trajectories(engine, "run-l", f"t{k}", 0, [1.0, 0.0, 0.0, 1.0]))
    run_policy(cfg.policy, tiny_model_dir, name="policy-lease", route_prefix="/lease")
    curator = Curator.options(name="curator-l", namespace=NS).remote(cfg, "run-l", 1, 0.1)
    control = RunControl.options(name="control-l", namespace=NS).remote()
    job = TrainJob(
        config=cfg,
        run_id="run-l",
        model_dir=str(tiny_model_dir),
        run_dir=str(tmp_path),
        curator="curator-l",
        policy_app="policy-lease",
        control="control-l",
        namespace=NS,
    )
    fit(cfg, job, tmp_path, "lease")
    steps = ray.get(control.history.remote())
    assert [round(s["simulated_step_s"]) for s in steps] == [3, 3]
    assert store.log.buffer("run-l") == {(0, RowState.CONSUMED): 8}
    for actor in (curator, control):
        ray.kill(actor)
    from ray import serve

    serve.delete("policy-lease")
    store.dispose()


@ray.remote(num_cpus=0)
class _SplitBrainCurator:
    """A curator that restarted between the ranks' requests for step 0: each rank is handed
    a different real curated step under the same number (what `check_same_step` guards)."""

    def __init__(self, handed: dict[int, tuple[object, object]]) -> None:
        self.handed = handed

    def get_shard(
        self, session: int, step: int, rank: int, timeout_s: float | None = None
    ) -> tuple[object, object]:
        return self.handed[rank]

    def set_version(self, version: int) -> None:
        pass

    def release_step(self, session: int, step: int) -> int:
        return 0

    def forget_steps(self, session: int, steps: list[int]) -> None:
        pass


def test_ranks_handed_different_steps_refuse_to_train_them(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two FSDP ranks through Ray Train, each handed a different curated step as step 0: the
    worker loop's agreement check makes both raise StepMismatchError (the driver then
    restarts the trainer in a new session) instead of taking one optimizer step over two
    different batches as if they were one."""
    cfg = load_config(
        None,
        [
            f"run.root_dir={tmp_path}",
            "train.num_workers=2",
            "train.cpus_per_worker=0.4",
            "curation.group_size=4",
            "curation.groups_per_step=1",
            "policy.num_cpus=0.3",
            "policy.http_port=8123",
        ],
    )
    store = open_store(cfg, init=True)
    engine = HFEngine(tiny_model_dir)
    for k in range(2):
        log_group(store, policy_trajectories(engine, "run-s", f"t{k}", 0, [1.0, 0.0, 0.0, 1.0]))
    core = CuratorCore(store.log, store.blobs, settings_from_config(cfg, "run-s", 2))
    core.poll()
    a, b = core.take_step(), core.take_step()
    assert a is not None and b is not None

    def info(ts: TrainStep) -> StepInfo:
        return StepInfo(0, ts.num_samples, 1, len(ts.rows), ts.mean_reward, tuple(ts.claims))

    run_policy(cfg.policy, tiny_model_dir, name="policy-split", route_prefix="/split")
    curator = _SplitBrainCurator.options(name="curator-s", namespace=NS).remote(
        {0: (a.shards[0], info(a)), 1: (b.shards[1], info(b))}
    )
    control = RunControl.options(name="control-s", namespace=NS).remote()
    job = TrainJob(
        config=cfg,
        run_id="run-s",
        model_dir=str(tiny_model_dir),
        run_dir=str(tmp_path),
        curator="curator-s",
        policy_app="policy-split",
        control="control-s",
        namespace=NS,
    )
    with pytest.raises(Exception, match="ranks were handed different curated steps"):
        fit(cfg, job, tmp_path, "split")
    for actor in (curator, control):
        ray.kill(actor)
    from ray import serve

    serve.delete("policy-split")
    store.dispose()


def test_a_publish_whose_policy_app_is_gone_fails_at_once_with_the_reason(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Issue 45, point 9, at its call site (`Publisher.publish`): with a training job running,
    an operator's command deleted its `policy-<run_id>` application; the trainer then waited
    in `update_weights(...).result()` for ever (no timeout), the run stopped answering its
    stop, and Ray killed it 300 s later. Now the publish fails within a poll, naming the app,
    and the checkpoint row it opened is FAILED (the trainer's failure ends or restarts the
    run as any failure does)."""
    import time

    from ray import serve

    from dart_ray.store.checkpoints import FAILED
    from dart_ray.train.publisher import Publisher, PublishError

    cfg = load_config(None, [f"run.root_dir={tmp_path}", "train.publish_timeout_s=600"])
    app = "policy-gone-run"
    run_policy(cfg.policy, tiny_model_dir, name=app, route_prefix="/gone-run")
    store = open_store(cfg, init=True)
    pub = object.__new__(Publisher)
    pub.job = TrainJob(cfg, "gone-run", str(tiny_model_dir), str(tmp_path), "c", app, "x", NS)
    pub.store, pub.adapter = store, None
    pub.policy = serve.get_deployment_handle("PolicyServer", app)
    state = {k: v.clone() for k, v in HFEngine(tiny_model_dir).model.state_dict().items()}
    pub.publish(1, state)  # the app is there: it loads
    serve.delete(app)
    t0 = time.monotonic()
    with pytest.raises(PublishError, match=f"v2: the policy application '{app}' is gone"):
        pub.publish(2, state)
    assert time.monotonic() - t0 < 60  # a poll or two, never publish_timeout_s
    assert store.checkpoints.latest("gone-run", status=FAILED).version_num == 2  # type: ignore[union-attr]
    store.dispose()
