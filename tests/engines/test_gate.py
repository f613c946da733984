"""The version gate: updates drain the generations in flight, or land at their next token
boundary (partial rollouts), and every token says which version sampled it."""

from __future__ import annotations

import asyncio
import time

import pytest

from dart_ray.engines.base import Generation, VersionGate, versions_per_token


def test_versions_per_token_hand_derived() -> None:
    # 6 tokens on version 3; an update to 4 lands before token 2, one to 6 before token 5
    assert versions_per_token(6, 3, [(2, 4), (5, 6)]) == (3, (3, 3, 4, 4, 4, 6))
    # no switch, or a switch after the last token: one version, no per-token list
    assert versions_per_token(6, 3, []) == (3, ())
    assert versions_per_token(2, 3, [(2, 4)]) == (3, ())
    # a switch before the first token: every token is the new version's, and it is the oldest
    assert versions_per_token(3, 3, [(0, 4)]) == (4, ())
    assert versions_per_token(0, 3, [(0, 4)]) == (3, ())


def test_a_generation_names_its_oldest_version() -> None:
    ok = Generation("a", (1, 2), (0,), (-1.0, -1.0), (0.0, 0.0), 3, "stop", token_versions=(3, 4))
    assert ok.newest_version == 4
    with pytest.raises(ValueError, match="oldest"):
        Generation("a", (1, 2), (0,), (-1.0, -1.0), (0.0, 0.0), 4, "stop", token_versions=(3, 4))
    with pytest.raises(ValueError, match="token versions"):
        Generation("a", (1, 2), (0,), (-1.0, -1.0), (0.0, 0.0), 3, "stop", token_versions=(3,))


async def _generation(gate: VersionGate, tokens: int, step_s: float) -> tuple[int, tuple]:  # type: ignore[type-arg]
    """A generation that decodes `tokens` tokens, one step each, offering a boundary after
    every step; returns (oldest version, per-token versions)."""
    async with gate.generating() as lease:
        for i in range(tokens):
            await asyncio.sleep(step_s)
            await lease.boundary(i + 1)
        return lease.versions(tokens)


def _update_during(gate: VersionGate, tokens: int, step_s: float, load_s: float) -> dict:  # type: ignore[type-arg]
    async def main() -> dict:  # type: ignore[type-arg]
        gen = asyncio.create_task(_generation(gate, tokens, step_s))
        await asyncio.sleep(step_s * 2.5)  # the update asks in the middle of the third step
        t0 = time.monotonic()
        async with gate.updating(1):
            loaded_at = time.monotonic() - t0
            await asyncio.sleep(load_s)
        version, per_token = await gen
        return {"loaded_at": loaded_at, "version": version, "per_token": per_token}

    return asyncio.run(main())


def test_drain_the_update_waits_for_the_generation_to_finish() -> None:
    """20 steps of 20 ms; the update asks at 50 ms, so it waits ~350 ms for the rest, and
    the generation is all version 0."""
    gate = VersionGate()
    out = _update_during(gate, tokens=20, step_s=0.02, load_s=0.05)
    assert out["loaded_at"] == pytest.approx(0.35, abs=0.08)
    assert out["version"] == 0 and out["per_token"] == ()
    assert gate.version == 1 and gate.updates == 1
    assert gate.wait_s == pytest.approx(0.35, abs=0.08)
    assert gate.blocked_s == pytest.approx(0.40, abs=0.08)


def test_interrupt_the_update_lands_at_the_next_boundary_and_the_rest_is_the_new_version() -> None:
    """Same generation, interruptible gate: the update waits ~10 ms (to the end of the third
    step), the generation pauses while it loads, and tokens 3.. are version 1's."""
    gate = VersionGate(interruptible=True)
    out = _update_during(gate, tokens=20, step_s=0.02, load_s=0.05)
    assert out["loaded_at"] < 0.04
    assert out["version"] == 0
    assert out["per_token"] == (0, 0, 0) + (1,) * 17
    assert gate.wait_s < 0.04 and gate.blocked_s == pytest.approx(0.06, abs=0.04)


def test_interrupt_new_generations_wait_for_the_load_and_start_on_the_new_version() -> None:
    async def main() -> tuple:  # type: ignore[type-arg]
        gate = VersionGate(interruptible=True)

        async def update() -> None:
            async with gate.updating(1):
                await asyncio.sleep(0.05)

        up = asyncio.create_task(update())
        await asyncio.sleep(0.01)
        t0 = time.monotonic()
        result = await _generation(gate, 3, 0.001)
        await up
        return time.monotonic() - t0, result

    waited, (version, per_token) = asyncio.run(main())
    assert waited >= 0.035 and version == 1 and per_token == ()


def test_interrupt_waits_for_a_generation_between_boundaries() -> None:
    """A generation inside a long step (no boundary for 100 ms) holds the update that long:
    the boundary is where it may land, never inside a forward pass."""

    async def main() -> float:
        gate = VersionGate(interruptible=True)
        gen = asyncio.create_task(_generation(gate, 2, 0.1))
        await asyncio.sleep(0.01)
        t0 = time.monotonic()
        async with gate.updating(1):
            waited = time.monotonic() - t0
        await gen
        return waited

    assert asyncio.run(main()) == pytest.approx(0.09, abs=0.04)


def test_interrupt_several_generations_and_updates_in_a_row() -> None:
    """Three generations of 30 steps, two updates: every token's version is one of those
    published while it ran, never older than the one before, and each generation's oldest is
    the first."""

    async def main() -> list:  # type: ignore[type-arg]
        gate = VersionGate(interruptible=True)
        gens = [asyncio.create_task(_generation(gate, 30, 0.005)) for _ in range(3)]
        for v in (1, 2):
            await asyncio.sleep(0.04)
            async with gate.updating(v):
                await asyncio.sleep(0.01)
        return list(await asyncio.gather(*gens))

    for version, per_token in asyncio.run(main()):
        assert version == 0 and per_token[0] == 0 and per_token[-1] == 2
        assert list(per_token) == sorted(per_token) and set(per_token) == {0, 1, 2}
