"""Config: TOML + overrides, validation that names the key, secrets never in the config."""

from __future__ import annotations

from pathlib import Path

import pytest

from dart_ray.config import Config, ConfigError, field_docs, load_config, read_secret, redact
from dart_ray.store import resolve_url

REPO = Path(__file__).resolve().parents[1]


def test_shipped_configs_load() -> None:
    for path in sorted((REPO / "configs").glob("*.toml")):
        assert isinstance(load_config(path), Config), path


def test_overrides_take_toml_values() -> None:
    c = load_config(
        REPO / "configs" / "tiny-cpu.toml",
        [
            "algo.eps_high=0.2",
            "run.mode=sync",
            'run.name="a b"',
            "curation.success_replay=false",
            "policy.model_path=/m/x",
        ],
    )
    assert c.algo.eps_high == 0.2
    assert c.run.mode == "sync" and c.run.name == "a b"
    assert c.curation.success_replay is False
    assert c.policy.model_path == Path("/m/x")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("algo.eps_high=-1", "algo.eps_high = -1: Input should be greater than 0"),
        ("run.mode=async", "run.mode = 'async': Input should be 'decoupled' or 'sync'"),
        ("env.num_sessions=many", "env.num_sessions = 'many'"),
        ("algo.eps_hihg=0.2", "algo.eps_hihg: unknown key"),
        ("nosuch.key=1", "nosuch: unknown key"),
        ("run.run_id=../x", "run.run_id = '../x': must be 1-128 characters"),
        ("policy.temperature=0", "  policy.temperature = 0: rollouts must sample"),
        ("policy.top_k=-1", "policy.top_k = -1: Input should be greater than or equal to 0"),
        ("train.ppo_epochs=0", "train.ppo_epochs = 0: Input should be greater than or equal to 1"),
        ("algo.off_policy=tis", "algo.off_policy = 'tis': Input should be 'token_tis'"),
        ("algo.mask_high=0.9", "[algo.mask_low, algo.mask_high] = [0.5, 0.9] must contain 1"),
        ("env.wait_s=30", "env.wait_s (30) must be shorter than env.step_timeout_s (30)"),
        ("env.wait_s=-1", "env.wait_s = -1: Input should be greater than or equal to 0"),
        ("env.max_type_chars=0", "env.max_type_chars = 0: Input should be greater than or equal"),
        ("algo.credit=gigpo", "algo.credit = 'gigpo': Input should be 'trajectory' or 'step'"),
        ("algo.step_gamma=0", "algo.step_gamma = 0: Input should be greater than 0"),
        ("algo.step_gamma=1.5", "algo.step_gamma = 1.5: Input should be less than or equal to 1"),
        ("algo.step_weight=-1", "algo.step_weight = -1: Input should be greater than or equal"),
        ("algo.step_norm=max", "algo.step_norm = 'max': Input should be 'mean' or 'std'"),
    ],
)
def test_errors_name_the_key_and_value(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert expected in str(e.value)


def test_replay_seeds_need_replay_and_an_engine_that_scores(tmp_path: Path) -> None:
    from dart_ray.run.preflight import check_local_inputs

    seeds = "curation.replay_seeds='x.jsonl'"
    with pytest.raises(ConfigError, match=r"needs curation\.success_replay = true"):
        load_config(None, [seeds, "curation.success_replay=false"])
    from dart_ray.run.runtime import start

    with pytest.raises(ConfigError, match=r"policy\.engine = 'vllm' cannot: use 'hf'"):
        start(load_config(None, [seeds, "policy.engine='vllm'"]))  # before anything starts
    load_config(None, [seeds, "policy.engine='script'"])  # `dart-ray eval` of the same config
    missing = load_config(None, [f"curation.replay_seeds='{tmp_path / 'none.jsonl'}'"])
    with pytest.raises(ConfigError, match=r"curation.replay_seeds: .*cannot read scripts"):
        check_local_inputs(missing)  # before anything starts, on a cluster too


def test_step_credit_reaches_the_curator() -> None:
    """The `[algo]` credit knobs are the curator's `CurationParams` (the curator computes the
    advantages), as `algo.advantage` is."""
    from actors.curator import settings_from_config

    c = load_config(
        REPO / "configs" / "tiny-cpu.toml",
        [
            "algo.credit='step'",
            "algo.step_gamma=0.9",
            "algo.step_weight=0.5",
            "algo.step_norm='std'",
        ],
    )
    p = settings_from_config(c, "run-x", 1).params
    assert (p.credit, p.step_gamma, p.step_weight, p.step_norm) == ("step", 0.9, 0.5, "std")
    d = settings_from_config(load_config(REPO / "configs" / "tiny-cpu.toml"), "run-x", 1).params
    assert (d.credit, d.step_gamma, d.step_weight, d.step_norm) == ("trajectory", 0.95, 1.0, "mean")


def test_bad_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[algo\neps_high = 0.2\n")
    with pytest.raises(ConfigError, match=r"bad.toml is not valid TOML"):
        load_config(bad)
    wrong = tmp_path / "wrong.toml"
    wrong.write_text("[train]\nlr = 'fast'\n")
    with pytest.raises(ConfigError, match=r"wrong.toml\):\n  train.lr = 'fast'"):
        load_config(wrong)
    with pytest.raises(ConfigError, match="expected key=value"):
        load_config(None, ["algo.eps_high"])


def test_password_in_dsn_is_refused_and_masked() -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, ["store.dsn=mysql+pymysql://dart:hunter2@db:3306/dart"])
    assert "hunter2" not in str(e.value)
    assert "contains a password" in str(e.value)


def test_password_comes_from_env_or_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    c = load_config(None, ["store.dsn=mysql+pymysql://dart@db:3306/dart"])
    monkeypatch.delenv("DART_RAY_DB_PASSWORD", raising=False)
    assert resolve_url(c).password is None
    monkeypatch.setenv("DART_RAY_DB_PASSWORD", "from-env")
    assert resolve_url(c).password == "from-env"
    f = tmp_path / "pw"
    f.write_text("from-file\n")
    c2 = load_config(
        None, ["store.dsn=mysql+pymysql://dart@db:3306/dart", f"store.password_file={f}"]
    )
    assert resolve_url(c2).password == "from-file"
    assert "from-file" not in str(c2.redacted()) and "from-env" not in str(c2.redacted())
    with pytest.raises(ConfigError, match="cannot read secret file"):
        read_secret(None, tmp_path / "absent")


def test_dsn_env_may_hold_a_password_but_never_shows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_DSN", "mysql+pymysql://dart:s3cret@db:3306/dart")
    c = load_config(None, ["store.dsn_env=MY_DSN"])
    assert resolve_url(c).password == "s3cret"
    assert "s3cret" not in str(c.redacted())
    monkeypatch.delenv("MY_DSN")
    with pytest.raises(ConfigError, match=r"names \$MY_DSN, which is not set"):
        resolve_url(c)


def test_redact_masks_secret_keys_and_url_passwords() -> None:
    got = redact(
        {
            "a": {"api_token": "t0k", "token_env": "TOKEN", "url": "mysql://u:pw@h/d"},
            "b": ["x://u:p@h"],
        }
    )
    assert got == {
        "a": {"api_token": "***", "token_env": "TOKEN", "url": "mysql://u:***@h/d"},
        "b": ["x://u:***@h"],
    }


def test_every_field_is_documented() -> None:
    rows = field_docs()
    assert len(rows) > 50
    undocumented = [k for k, _, doc in rows if not doc]
    assert undocumented == []


def test_policy_fields_of_the_policy_server() -> None:
    cfg = load_config(None, ["policy.vllm_logprobs_topk=-1", "policy.weights_load='copy'"])
    assert cfg.policy.vllm_logprobs_topk == -1 and cfg.policy.weights_load == "copy"
    with pytest.raises(ConfigError, match=r"policy\.vllm_logprobs_topk = 0: must be -1"):
        load_config(None, ["policy.vllm_logprobs_topk=0"])
    with pytest.raises(ConfigError, match=r"policy\.weights_load"):
        load_config(None, ["policy.weights_load='mmap'"])


def test_sampling_vllm_cannot_reproduce_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"vLLM samples at temperatures up to 2"):
        load_config(None, ["policy.engine=vllm", "policy.temperature=2.5"])
    assert load_config(None, ["policy.engine=hf", "policy.temperature=2.5"])


def test_partial_rollouts_on_vllm_are_refused_with_the_way_out() -> None:
    with pytest.raises(ConfigError, match=r"interrupt_on_update is not implemented for .*vllm"):
        load_config(None, ["policy.engine=vllm", "policy.interrupt_on_update=true"])
    assert load_config(None, ["policy.interrupt_on_update=true"]).policy.interrupt_on_update


def test_policy_route_beyond_loopback_needs_a_token(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1"):
        assert load_config(None, [f'policy.http_host="{host}"']).policy.http_host == host
    with pytest.raises(ConfigError) as e:
        load_config(None, ['policy.http_host="0.0.0.0"'])
    assert "policy.http_host = '0.0.0.0' serves beyond this machine" in str(e.value)
    assert "policy.auth_token_file" in str(e.value)
    f = tmp_path / "token"
    ok = load_config(None, ['policy.http_host="0.0.0.0"', f"policy.auth_token_file={f}"])
    assert ok.policy.auth_token_file == f
    assert load_config(None, ['policy.http_host="10.1.2.3"', "policy.auth_token_env=TOK"])


def test_unknown_keys_and_wrong_types_in_a_file_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[policy]\nauth_token = "s3cret"\n[env.desktop]\nsettle_s = "slow"\n')
    with pytest.raises(ConfigError) as e:
        load_config(bad)
    msg = str(e.value)
    assert "policy.auth_token: unknown key" in msg
    assert "env.desktop.settle_s = 'slow': Input should be a valid number" in msg
    assert "s3cret" not in msg


def test_redacted_yaml_is_the_redacted_config() -> None:
    import yaml

    c = load_config(None, ['env.desktop.server_url="http://u:pw-in-url@host:5000"'])
    text = c.redacted_yaml()
    assert "pw-in-url" not in text
    assert yaml.safe_load(text) == c.redacted()
    assert yaml.safe_load(text)["env"]["desktop"]["server_url"] == "http://u:***@host:5000"


def test_lr_zero_is_the_control_run_and_a_negative_lr_is_refused() -> None:
    assert load_config(None, ["train.lr=0"]).train.lr == 0.0
    with pytest.raises(ConfigError, match=r"train\.lr"):
        load_config(None, ["train.lr=-1e-4"])
