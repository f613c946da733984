"""End to end on CPU (marker `slow`): `driver.train` in both modes, on real Ray, Serve, Ray
Train, MiniDesk sessions, the warm-started tiny model and a SQLite log."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import sqlalchemy as sa
import torch

from dart_ray.config import Config, load_config
from dart_ray.run import driver
from dart_ray.store import open_store
from dart_ray.store.db import RowState, checkpoint, dataset_usage_events, rollout_run

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_local")]


@pytest.mark.parametrize(
    ("mode", "sampling"), [("decoupled", "batch"), ("sync", "batch"), ("sync", "dynamic")]
)
def test_a_short_run_accounts_for_everything(mode: str, sampling: str, tmp_path: Path) -> None:
    cfg = load_config(
        REPO / "configs" / "tiny-cpu.toml",
        [
            f"run.root_dir={tmp_path}",
            f"run.mode={mode}",
            f"run.sync_sampling={sampling}",
            f"run.run_id=e2e-{mode}",
            "run.max_versions=2",
            "run.eval_tasks=2",
            "run.max_minutes=8",
            "env.num_sessions=2",
            "rollout.in_flight=2",
            "rollout.max_steps=2",
            "policy.max_new_tokens=24",
            "curation.groups_per_step=1",
            "curation.group_timeout_s=30",
            # the pipeline is under test, not the tiny policy's competence: a group without
            # a success still makes a (KL-only) training step
            "curation.drop_no_signal=false",
            "train.save_every=1",
            f"policy.http_port={8130 if mode == 'sync' else 8131}",
            # decoupled: two rollouters (tasks and sessions sharded) feed one curator
            f"rollout.rollouters={1 if mode == 'sync' else 2}",
        ],
    )
    report = driver.train(cfg)
    assert report.versions == 2 and report.train_steps == 2 and report.policy_version == 2
    assert report.sync_count == 2 and report.sync_latency_mean_s > 0
    assert report.heldout_before is not None and report.heldout_after is not None
    assert 0 < report.env_utilisation <= 1 and 0 < report.trainer_utilisation <= 1
    run_dir = tmp_path / f"e2e-{mode}"
    assert (run_dir / "report.json").is_file() and (run_dir / "curve.png").is_file()
    assert (run_dir / "system.png").is_file() and report.trainer_busy and report.sync_latency
    assert any((run_dir / "tb").iterdir())
    # the trainer scored what the engine sampled: on tokens of the weights it held, the gap
    # between the two log-probs is float noise (the sync mode is on-policy at every step)
    assert [int(r["version"]) for r in report.off_policy] == [1, 2]
    onpolicy = [
        r["onpolicy_logp_diff_abs"] for r in report.off_policy if "onpolicy_logp_diff_abs" in r
    ]
    assert onpolicy and max(onpolicy) < 1e-3
    if mode == "sync":  # every step holds samples of the weights it starts from
        trained_at = [
            (int(r["version"]) - 1, r.get("sample_version_max")) for r in report.off_policy
        ]
        assert all(v == hi for v, hi in trained_at), trained_at
        assert len(onpolicy) == 2

    store = open_store(cfg)
    with store.engine.connect() as c:
        statuses = Counter(
            c.scalars(sa.select(rollout_run.c.status).where(rollout_run.c.run_id == f"e2e-{mode}"))
        )
        states = Counter(
            c.scalars(sa.select(rollout_run.c.state).where(rollout_run.c.run_id == f"e2e-{mode}"))
        )
        acks = Counter(
            c.scalars(
                sa.select(dataset_usage_events.c.row_id).where(
                    dataset_usage_events.c.event_type == "ACK"
                )
            )
        )
        unexplained_drops = c.scalar(
            sa.select(sa.func.count()).where(
                rollout_run.c.run_id == f"e2e-{mode}",
                rollout_run.c.state == RowState.DROPPED,
                rollout_run.c.drop_reason.is_(None),
            )
        )
        versions = list(
            c.scalars(
                sa.select(checkpoint.c.version_num)
                .where(checkpoint.c.status == "COMPLETED")
                .order_by(checkpoint.c.id)
            )
        )
    # every trajectory the rollouter logged is in the log with its status
    assert sum(statuses.values()) == sum(report.trajectories.values())
    assert set(statuses) <= {"OK", "TRUNCATED", "ABORTED", "ENV_ERROR", "POLICY_ERROR"}
    # nothing is left claimed; every row is trained once, dropped with a reason, or waiting
    assert states[RowState.CLAIMED] == 0
    assert unexplained_drops == 0
    assert sum(report.dropped.values()) == states[RowState.DROPPED]
    assert set(acks.values()) <= {1}
    assert states[RowState.CONSUMED] == report.rows_trained == len(acks)
    assert versions == [1, 2]  # only up
    store.dispose()


def test_a_lora_run_moves_only_adapters_resumes_from_them_and_evaluates(tmp_path: Path) -> None:
    """`train.lora` end to end: the trainer trains adapters, the replicas sample with the
    published adapters (the on-policy log-prob gap is float noise), checkpoints are adapter
    folders tied to their base, a resumed run continues from them, `dart-ray eval` loads one."""
    from dart_ray.evaluation.local import run_eval
    from dart_ray.models import lora

    def config(*extra: str) -> Config:
        return load_config(
            REPO / "configs" / "tiny-cpu.toml",
            [
                f"run.root_dir={tmp_path}",
                "run.run_id=e2e-lora",
                "run.eval_tasks=0",
                "run.max_minutes=8",
                "env.num_sessions=2",
                "rollout.in_flight=2",
                "rollout.max_steps=2",
                "policy.max_new_tokens=24",
                "curation.groups_per_step=1",
                "curation.drop_no_signal=false",
                "train.save_every=1",
                "train.lora.enabled=true",
                "train.lora.rank=4",
                "policy.http_port=8132",
                *extra,
            ],
        )

    report = driver.train(config("run.max_versions=2"))
    assert report.versions == 2 and report.sync_count == 2
    onpolicy = [r["onpolicy_logp_diff_abs"] for r in report.off_policy if "onpolicy_logp_diff_abs" in r]  # fmt: skip
    assert onpolicy and max(onpolicy) < 1e-3
    ckpts = tmp_path / "e2e-lora" / "checkpoints"
    for v in ("v1", "v2"):
        assert (
            lora.is_adapter_checkpoint(ckpts / v) and not (ckpts / v / "model.safetensors").exists()
        )
    assert lora.base_folder(ckpts / "v2") == (REPO / "fixtures" / "tiny-sft").resolve()
    v2 = lora.read_adapter_checkpoint(ckpts / "v2")[2]

    resumed = driver.train(config("run.max_versions=3", "run.resume=true"))
    assert resumed.policy_version == 3
    v3 = lora.read_adapter_checkpoint(ckpts / "v3")[2]
    assert set(v3) == set(v2) and any(not torch.equal(v3[k], v2[k]) for k in v2)

    result = run_eval(config(), ckpts / "v3", "heldout", n_tasks=2)
    assert len(result.per_task) == 2 and result.greedy


def test_written_solutions_seed_replay_so_a_policy_that_never_succeeds_trains(
    tmp_path: Path,
) -> None:
    """The untrained tiny model never clicks the button: every group fails, and without a
    success to replay no group has a signal. Solutions of the run's four tasks (the oracle's
    click as a script) seed the replay pool at the start, so all-fail groups train on them:
    versions are published, the report names the seeded tasks and their replays, and the
    audit finds nothing lost or trained twice. The bound is 1 version: a seed of version 0
    is past it from version 2 on, so the run reaches 4 versions only because a seed that
    has aged is played again."""
    import json

    from dart_ray.envs.minidesk.env import MiniDeskEnv
    from dart_ray.envs.minidesk.oracle import oracle_action
    from dart_ray.envs.suites import load_suite
    from dart_ray.store.audit import audit

    overrides = [
        f"run.root_dir={tmp_path}",
        "run.run_id=seeded",
        "run.max_versions=4",
        "run.eval_tasks=0",
        "run.max_minutes=6",
        "env.task_limit=4",
        "env.num_sessions=2",
        "rollout.in_flight=2",
        "rollout.max_steps=2",
        "policy.max_new_tokens=16",
        "curation.groups_per_step=1",
        "curation.max_staleness=1",
        "policy.http_port=8132",
    ]
    cfg = load_config(REPO / "configs" / "tiny-cpu.toml", overrides)
    rows = []
    for task in load_suite(cfg, "train"):
        desk = MiniDeskEnv(cfg.env)
        desk.reset(task)
        x, y = oracle_action(desk).point  # type: ignore[misc]
        rows.append({"instruction": task.instruction, "actions": [f"click(start_box='({x},{y})')"]})
    scripts = tmp_path / "scripts.jsonl"
    scripts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    seeded = load_config(
        REPO / "configs" / "tiny-cpu.toml", [*overrides, f"curation.replay_seeds='{scripts}'"]
    )
    untrained = seeded.policy.model_copy(update={"model_path": None})  # the embedded tiny model
    report = driver.train(seeded.model_copy(update={"policy": untrained}))
    assert [s["seeded"] for s in report.replay_seeds] == [True] * 4
    assert report.versions == 4
    assert sum(s["replays"] for s in report.replay_seeds) >= 4  # one per trained group at least
    assert sum(s["again"] for s in report.replay_seeds) >= 1
    assert report.trajectories.get("OK", 0) + report.trajectories.get("TRUNCATED", 0) > 0
    store = open_store(cfg)
    assert audit(store.engine, "seeded").ok
    store.dispose()
