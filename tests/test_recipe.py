"""The GPU recipe (configs/osworld-uitars-7b.toml) through the real loader: DART-GUI's
hyperparameters where we follow them, the DSN from the environment, absolute paths."""

from __future__ import annotations

from pathlib import Path

import pytest

from dart_ray.cli import main
from dart_ray.config import Config, ConfigError, load_config
from dart_ray.store import resolve_url

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "osworld-uitars-7b.toml"


@pytest.fixture(scope="module")
def recipe() -> Config:
    return load_config(RECIPE)


def test_dart_gui_hyperparameters(recipe: Config) -> None:
    a, t, p, r = recipe.algo, recipe.train, recipe.policy, recipe.rollout
    # REFERENCE.md: PPO clip 0.1 / 0.28, dual clip 10, IS cap 1.0, KL 0.1, grad clip 2.0,
    # lr 1e-6, weight decay 0.1, 500 tokens, 30 steps, 8 rollouts, last 5 screenshots and
    # 35 responses, 2 newest versions (staleness <= 1), success replay
    assert (a.loss, a.eps_low, a.eps_high, a.dual_clip, a.is_cap) == ("ppo", 0.1, 0.28, 10.0, 1.0)
    assert a.kl_beta == 0.1
    assert (t.lr, t.weight_decay, t.grad_clip) == (1e-6, 0.1, 2.0)
    assert (p.max_new_tokens, p.history_images, p.history_turns) == (500, 5, 35)
    assert 0.7 <= p.temperature <= 1.0
    assert (r.max_steps, r.n_rollouts, recipe.curation.group_size) == (30, 8, 8)
    assert recipe.curation.max_staleness == 1 and recipe.curation.success_replay
    assert 6 <= recipe.curation.groups_per_step <= 8


def test_where_ours_differ_is_said_in_the_file() -> None:
    text = RECIPE.read_text()
    for key in ("advantage", "eval_tasks", "max_sessions", "autoscaling", "dynamic_rollouts"):
        line = next(ln for ln in text.splitlines() if ln.startswith(key) or f"{key} =" in ln)
        block = text[: text.index(line) + len(line)].splitlines()[-4:]
        assert any("ours" in b for b in block), f"{key}: no 'ours:' comment near {line!r}"


def test_the_model_the_engine_and_the_gpus(recipe: Config) -> None:
    p, t = recipe.policy, recipe.train
    assert p.engine == "vllm" and p.dtype == "bfloat16"
    assert p.model_path is not None and p.model_path.is_absolute()
    assert p.model_path.name == "UI-TARS-1.5-7B"
    assert p.allow_special_tokens == ("<|box_start|>", "<|box_end|>")  # UI-TARS writes them
    assert p.num_gpus == 1 and p.autoscaling and p.min_replicas <= p.max_replicas
    assert t.use_gpu and t.num_workers >= 2 and t.gpus_per_worker == 1
    assert recipe.env.kind == "osworld" and recipe.env.desktop.pool_url
    # every path is absolute: the job's processes run in other folders on other nodes
    for path in (recipe.run.root_dir, recipe.env.tasks, recipe.env.heldout_tasks):
        assert path is not None and Path(path).is_absolute()
    assert recipe.store.blob_uri and recipe.store.blob_uri.startswith(("/", "s3://"))
    assert recipe.rollout.in_flight >= (recipe.env.max_sessions or 0)


def test_the_dsn_comes_from_the_environment(
    recipe: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert recipe.store.dsn is None and recipe.store.dsn_env == "DART_RAY_DB_DSN"
    monkeypatch.delenv("DART_RAY_DB_DSN", raising=False)
    with pytest.raises(ConfigError, match=r"\$DART_RAY_DB_DSN, which is not set"):
        resolve_url(recipe)
    monkeypatch.setenv("DART_RAY_DB_DSN", "mysql+pymysql://dart:pw@db:3306/dart")
    url = resolve_url(recipe)
    assert (url.get_backend_name(), url.host, url.database) == ("mysql", "db", "dart")
    assert "pw" not in str(recipe.redacted())


def test_config_show_prints_it_with_no_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DART_RAY_DB_DSN", "mysql+pymysql://dart:hunter2@db:3306/dart")
    assert main(["config", "show", "--config", str(RECIPE)]) == 0
    out = capsys.readouterr().out
    assert '"model_path": "/mnt/shared/models/UI-TARS-1.5-7B"' in out and "hunter2" not in out
