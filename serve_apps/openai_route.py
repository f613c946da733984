"""The OpenAI chat-completions wire format of the policy server's HTTP route: the request's
fields read into `SamplingParams` (each malformed or unsupported field a `BadRequest` naming
it, which the route answers with 400) and the response's `logprobs` in OpenAI's shape.

Fields OpenAI defines that the engines do not implement are refused unless they carry the
value that changes nothing (clients send some by default); a field OpenAI does not define is
refused too, so a typo never passes silently.
"""

from __future__ import annotations

import json
import math
from typing import Any

from dart_ray.engines.base import Generation, SamplingParams
from dart_ray.uitars.prompts import BadRequest

MAX_HTTP_TOKENS = 4096
"""Largest `max_tokens` the HTTP route accepts (a bound on the work one request can ask)."""


def _number(body: dict[str, Any], key: str, default: float, integer: bool = False) -> Any:
    v = body.get(key)
    if v is None:
        return default
    kind = int if integer else (int, float)
    if (
        isinstance(v, bool)
        or not isinstance(v, kind)
        or (isinstance(v, float) and not math.isfinite(v))
    ):
        what = "an integer" if integer else "a finite number"
        raise BadRequest(f"{key} must be {what}, got {json.dumps(v)[:60]}")
    return v


MAX_N = 16
"""Largest `n` (choices per request) the HTTP route accepts."""
MAX_TOP_LOGPROBS = 20
"""Largest `top_logprobs` the HTTP route accepts (OpenAI's bound)."""

ROUTE_FIELDS = frozenset(
    {"model", "messages", "temperature", "top_p", "top_k", "max_tokens"}
    | {"max_completion_tokens", "stop", "n", "logprobs", "top_logprobs", "stream", "user"}
)
"""The request fields the route reads (`user`, OpenAI's end-user id, is accepted and unused)."""
NEUTRAL_FIELDS: dict[str, Any] = {
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logit_bias": {},
    "seed": None,
    "store": False,
    "metadata": {},
    "parallel_tool_calls": True,
    "tools": [],
    "stream_options": None,
}
"""OpenAI fields the route does not implement, accepted at the value that changes nothing
(what some clients send by default); any other value is a 400 naming the field."""


def sampling_of(body: dict[str, Any], defaults: SamplingParams) -> SamplingParams:
    """The sampling fields of an OpenAI request; BadRequest names the field that is wrong.
    `max_completion_tokens` is OpenAI's current name for `max_tokens` (either; both only
    when they agree)."""
    for key in body:
        if key in NEUTRAL_FIELDS:
            if body[key] not in (None, NEUTRAL_FIELDS[key]):
                raise BadRequest(f"{key} is not supported (only {json.dumps(NEUTRAL_FIELDS[key])})")
        elif key not in ROUTE_FIELDS:
            raise BadRequest(f"unknown field {key!r}")
    temperature = _number(body, "temperature", defaults.temperature)
    top_p = _number(body, "top_p", defaults.top_p)
    top_k = _number(body, "top_k", defaults.top_k, integer=True)
    tokens_key = (
        "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    )
    max_tokens = _number(body, tokens_key, defaults.max_new_tokens, integer=True)
    if tokens_key == "max_completion_tokens" and body.get("max_tokens") not in (None, max_tokens):
        raise BadRequest("max_tokens and max_completion_tokens differ: give one")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("stop must be a string or a list of strings")
    if temperature < 0:
        raise BadRequest(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise BadRequest(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise BadRequest(f"top_k must be >= 0 (0: off), got {top_k}")
    if max_tokens > MAX_HTTP_TOKENS:
        raise BadRequest(f"{tokens_key} must be at most {MAX_HTTP_TOKENS}")
    if max_tokens < 1:
        raise BadRequest(f"{tokens_key} must be at least 1, got {max_tokens}")
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise BadRequest(f"logprobs must be true or false, got {json.dumps(logprobs)[:60]}")
    top = _number(body, "top_logprobs", 0, integer=True)
    if not 0 <= top <= MAX_TOP_LOGPROBS:
        raise BadRequest(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {top}")
    if top and not logprobs:
        raise BadRequest("top_logprobs needs logprobs=true")
    return SamplingParams(
        float(temperature),
        float(top_p),
        int(max_tokens),
        tuple(stop),
        top_k=int(top_k),
        top_logprobs=int(top),
    )


def choices_n(body: dict[str, Any]) -> int:
    n = _number(body, "n", 1, integer=True)
    if not 1 <= n <= MAX_N:
        raise BadRequest(f"n must be in [1, {MAX_N}], got {n}")
    return int(n)


def _token(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text = str(tokenizer.decode([token_id], skip_special_tokens=False))
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def openai_logprobs(gen: Generation, tokenizer: Any) -> dict[str, Any]:
    """`choices[i].logprobs` in OpenAI's shape: one entry per response token (the end token
    included when sampled) with its log-prob under the distribution it was drawn from and,
    when asked, the most likely tokens of that distribution."""
    tops = gen.top_logprobs or ((),) * len(gen.response_ids)
    return {
        "content": [
            _token(tokenizer, t, lp) | {"top_logprobs": [_token(tokenizer, i, v) for i, v in top]}
            for t, lp, top in zip(gen.response_ids, gen.logprobs, tops, strict=True)
        ],
        "refusal": None,
    }
