"""The policy route's request validation and token loading, without starting Serve.

`test_policy.py` sends some of these bodies through a real Serve HTTP route; here every field
is covered directly: each malformed value is a 400 whose message names the field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from dart_ray.config import ConfigError, PolicyConfig
from dart_ray.engines.base import SamplingParams
from dart_ray.uitars.prompts import BadRequest
from serve_apps.openai_route import MAX_HTTP_TOKENS, choices_n, sampling_of
from serve_apps.policy import read_token

DEFAULTS = SamplingParams(1.0, 1.0, 64)


def test_sampling_fields_and_defaults() -> None:
    assert sampling_of({}, DEFAULTS) == DEFAULTS
    got = sampling_of({"temperature": 0, "top_p": 0.5, "max_tokens": 7, "stop": "\n"}, DEFAULTS)
    assert got == SamplingParams(0.0, 0.5, 7, ("\n",))
    assert sampling_of({"stop": ["a", "b"], "temperature": None}, DEFAULTS).stop == ("a", "b")
    assert sampling_of({"top_k": 40}, DEFAULTS).top_k == 40
    # OpenAI's current name for max_tokens; both only when they agree
    assert sampling_of({"max_completion_tokens": 9}, DEFAULTS).max_new_tokens == 9
    assert sampling_of({"max_completion_tokens": 9, "max_tokens": 9}, DEFAULTS).max_new_tokens == 9
    got = sampling_of({"logprobs": True, "top_logprobs": 3}, DEFAULTS)
    assert got.top_logprobs == 3
    assert sampling_of({"logprobs": False}, DEFAULTS).top_logprobs == 0
    # the values some clients send by default change nothing and pass
    neutral = {"presence_penalty": 0, "frequency_penalty": 0.0, "seed": None, "user": "u1"}
    assert sampling_of(neutral, DEFAULTS) == DEFAULTS


def test_n_is_an_integer_in_range() -> None:
    assert choices_n({}) == 1 and choices_n({"n": 3}) == 3
    for bad, message in [(0, "n must be in [1, 16], got 0"), (17, "got 17"), ("2", "integer")]:
        with pytest.raises(BadRequest, match=re.escape(message)):
            choices_n({"n": bad})


@pytest.mark.parametrize(
    "body, message",
    [
        ({"temperature": "hot"}, 'temperature must be a finite number, got "hot"'),
        ({"temperature": True}, "temperature must be a finite number, got true"),
        ({"temperature": float("nan")}, "temperature must be a finite number, got NaN"),
        ({"temperature": -1}, "temperature must be >= 0"),
        ({"top_p": 3}, "top_p must be in (0, 1]"),
        ({"top_p": [1]}, "top_p must be a finite number"),
        ({"top_k": -2}, "top_k must be >= 0 (0: off), got -2"),
        ({"top_k": 1.5}, "top_k must be an integer, got 1.5"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer, got 2.5"),
        ({"max_tokens": "10"}, 'max_tokens must be an integer, got "10"'),
        ({"max_tokens": 0}, "max_tokens must be at least 1"),
        ({"max_tokens": 10**400}, f"max_tokens must be at most {MAX_HTTP_TOKENS}"),
        ({"stop": 5}, "stop must be a string or a list of strings"),
        ({"stop": ["ok", {"x": 1}]}, "stop must be a string or a list of strings"),
        ({"max_completion_tokens": 0}, "max_completion_tokens must be at least 1"),
        ({"max_completion_tokens": "5"}, "max_completion_tokens must be an integer"),
        ({"max_completion_tokens": 5, "max_tokens": 6}, "max_tokens and max_completion_tokens"),
        ({"logprobs": "yes"}, 'logprobs must be true or false, got "yes"'),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be in [0, 20], got 21"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs must be in [0, 20]"),
        ({"logprobs": True, "top_logprobs": 0.5}, "top_logprobs must be an integer"),
        ({"top_logprobs": 3}, "top_logprobs needs logprobs=true"),
        ({"presence_penalty": 0.5}, "presence_penalty is not supported (only 0)"),
        ({"seed": 7}, "seed is not supported"),
        ({"tools": [{"type": "function"}]}, "tools is not supported"),
        ({"temprature": 0}, "unknown field 'temprature'"),
    ],
)
def test_each_bad_sampling_field_is_named(body: dict[str, Any], message: str) -> None:
    with pytest.raises(BadRequest) as e:
        sampling_of(body, DEFAULTS)
    assert message in str(e.value)


def test_token_from_file_env_or_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_token(PolicyConfig()) is None
    f = tmp_path / "token"
    f.write_text("from-the-file\nignored second line\n")
    monkeypatch.setenv("DART_TEST_POLICY_TOKEN_X", "from-the-env")
    assert read_token(PolicyConfig(auth_token_file=f)) == "from-the-file"
    assert read_token(PolicyConfig(auth_token_env="DART_TEST_POLICY_TOKEN_X")) == "from-the-env"
    both = PolicyConfig(auth_token_file=f, auth_token_env="DART_TEST_POLICY_TOKEN_X")
    assert read_token(both) == "from-the-file"  # the file wins


def test_a_configured_token_that_is_missing_stops_the_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DART_TEST_POLICY_TOKEN_UNSET", raising=False)
    with pytest.raises(ConfigError, match="names DART_TEST_POLICY_TOKEN_UNSET, which is not set"):
        read_token(PolicyConfig(auth_token_env="DART_TEST_POLICY_TOKEN_UNSET"))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        read_token(PolicyConfig(auth_token_file=empty))
    with pytest.raises(ConfigError, match="cannot read secret file"):
        read_token(PolicyConfig(auth_token_file=tmp_path / "absent"))
