"""The synchronous baseline's round, worked by hand: how many groups a `batch` round opens
(every session, at least a step's worth), and what the curator packs at its end."""

from __future__ import annotations

import pytest

from dart_ray.config import load_config
from dart_ray.run.driver import round_groups


@pytest.mark.parametrize(
    ("overrides", "groups"),
    [
        # DART-GUI's regime (configs/timing-osworld-7b.toml): 64 sessions / 8 rollouts = 8
        # groups fill every session, and a step is 8 groups
        (["env.num_sessions=64", "rollout.in_flight=64", "curation.groups_per_step=8"], 8),
        # the default run: 8 sessions hold one group at a time, but a step is 4 groups
        (["env.num_sessions=8", "rollout.in_flight=8", "curation.groups_per_step=4"], 4),
        # 128 sessions, a step of 4: the batch fills every session, 16 groups
        (["env.num_sessions=128", "rollout.in_flight=128", "curation.groups_per_step=4"], 16),
        # sessions beyond what the rollouter keeps in flight stay idle in any mode
        (["env.num_sessions=64", "rollout.in_flight=16", "curation.groups_per_step=1"], 2),
        # 20 sessions: 2.5 groups of 8 round up to 3 (every session busy in the first wave)
        (["env.num_sessions=20", "rollout.in_flight=20", "curation.groups_per_step=2"], 3),
    ],
)
def test_a_batch_round_fills_every_session_and_at_least_a_step(
    overrides: list[str], groups: int
) -> None:
    cfg = load_config(None, ["rollout.n_rollouts=8", "curation.group_size=8", *overrides])
    assert round_groups(cfg) == groups
