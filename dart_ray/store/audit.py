"""`dart-ray audit RUN`: prove from the database that a run lost and replayed nothing.

Read-only. Every check is a query over the run's rows in `episode_start`, `rollout_run`,
`dataset_usage_events` and `checkpoint`; a breach is a sentence naming the rows.

- every episode started is in the log with its status (OK, TRUNCATED, ABORTED, ENV_ERROR,
  POLICY_ERROR); a start without its trajectory is lost, unless the run is live (`live`);
- no step sample was trained twice: a row has at most one ACK event and `used` <= 1;
- no acknowledged data was lost: every ACKed row is CONSUMED, and its ACK names a COMPLETED
  checkpoint whose files exist (rows are acknowledged only once their training is durable);
- every CONSUMED row has its ACK, every DROPPED or QUARANTINED (bad data) row a reason;
- no row fed the gradients of two durable checkpoints: each checkpoint's `trainer_state.json`
  lists the rows it trained since the previous one (its lineage), and no row is in two
  lineages; when every durable checkpoint has one, every CONSUMED row is in one;
- versions only went up: checkpoint versions grow with their ids; published versions never
  repeat;
- no trained row was beyond the staleness bound: each lineage records the version of the
  weights that trained each row, and that version minus the row's must be at most the run's
  `curation.max_staleness` (`trained_lags` counts rows by that lag); a row of a DISCARDED
  version (weights lost to a resume) counts by its distance through the version tree
  (`Lineage.effective`), not its tag, as the tree was when the row trained (a later resume
  does not move it).

Rows still CLAIMED are reported, not counted as breaches: their lease returns them to the pool.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from dart_ray.records import Status
from dart_ray.store.checkpoints import Lineage
from dart_ray.store.db import (
    RowState,
    checkpoint,
    dataset_usage_events,
    episode_start,
    rollout_run,
    snapshot,
)
from dart_ray.store.db import run as run_table

STATUSES = {s.value for s in Status}


@dataclass
class AuditReport:
    run_id: str
    episodes_started: int = 0
    trajectories: dict[str, int] = field(default_factory=dict)
    """Logged trajectories by status."""
    states: dict[str, int] = field(default_factory=dict)
    """Rows by state (available, claimed, consumed, dropped)."""
    drops: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)
    """Rows settled as bad data, by where they broke (`blob_unreadable`, `curation`, ...)."""
    acks: int = 0
    checkpoints: dict[str, int] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)
    """COMPLETED checkpoint versions, in the order they were created."""
    max_staleness: int | None = None
    """The run's `curation.max_staleness` (from its config snapshot)."""
    trained_lags: dict[int, int] = field(default_factory=dict)
    """Trained rows by how many versions older they were than the weights that trained them
    (from the lineages that record it)."""
    in_flight: int = 0
    """Starts without a trajectory, tolerated because the run is live."""
    breaches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.breaches

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "ok": self.ok}, indent=2)


def _ids(xs: list[object], limit: int = 10) -> str:
    shown = ", ".join(str(x) for x in xs[:limit])
    return f"{shown}{', ...' if len(xs) > limit else ''} ({len(xs)})"


def audit(engine: Engine, run_id: str, *, live: bool = False) -> AuditReport:
    r = AuditReport(run_id)
    es, rr, ev, cp = episode_start.c, rollout_run.c, dataset_usage_events.c, checkpoint.c
    with snapshot(engine) as c:  # one moment of a live run, not one per query
        r.episodes_started = int(
            c.scalar(sa.select(sa.func.count()).where(es.run_id == run_id)) or 0
        )
        lost = list(
            c.scalars(
                sa.select(es.trajectory_id)
                .select_from(
                    episode_start.outerjoin(
                        rollout_run,
                        sa.and_(rr.run_id == es.run_id, rr.trajectory_id == es.trajectory_id),
                    )
                )
                .where(es.run_id == run_id, rr.id.is_(None))
            )
        )
        rows = c.execute(
            sa.select(rr.id, rr.status, rr.state, rr.used, rr.drop_reason, rr.version_num).where(
                rr.run_id == run_id
            )
        ).all()
        snap = c.scalar(sa.select(run_table.c.config_json).where(run_table.c.run_id == run_id))
        acks = c.execute(
            sa.select(ev.row_id, ev.reason, ev.created_at).where(
                ev.run_id == run_id, ev.event_type == "ACK"
            )
        ).all()
        cps = c.execute(
            sa.select(cp.id, cp.version_num, cp.status, cp.path, cp.finished_at)
            .where(cp.run_id == run_id, cp.deleted_at.is_(None))
            .order_by(cp.id)
        ).all()

    if lost and live:
        r.in_flight = len(lost)
    elif lost:
        r.breaches.append(f"episodes started but never logged: {_ids(lost)}")

    r.trajectories = dict(Counter(row.status for row in rows))
    odd = [row.id for row in rows if row.status not in STATUSES]
    if odd:
        r.breaches.append(f"rows with an unknown status: {_ids(odd)}")
    r.states = {RowState.NAMES.get(k, str(k)): v for k, v in Counter(x.state for x in rows).items()}
    r.drops = dict(Counter(x.drop_reason or "" for x in rows if x.state == RowState.DROPPED))
    r.quarantined = dict(
        Counter(
            (x.drop_reason or "").split(":", 1)[0] for x in rows if x.state == RowState.QUARANTINED
        )
    )
    settled = (RowState.DROPPED, RowState.QUARANTINED)
    unexplained = [x.id for x in rows if x.state in settled and not x.drop_reason]
    if unexplained:
        r.breaches.append(f"rows dropped or quarantined without a reason: {_ids(unexplained)}")

    r.acks = len(acks)
    ack_count = Counter(a.row_id for a in acks)
    twice = sorted(i for i, n in ack_count.items() if n > 1)
    twice += sorted(x.id for x in rows if x.used > 1 and x.id not in ack_count)
    if twice:
        r.breaches.append(f"rows trained more than once: {_ids(twice)}")
    state = {x.id: x.state for x in rows}
    gone = sorted(i for i in ack_count if state.get(i) != RowState.CONSUMED)
    if gone:
        r.breaches.append(
            f"acknowledged rows no longer CONSUMED (acknowledged data lost): {_ids(gone)}"
        )
    unacked = sorted(x.id for x in rows if x.state == RowState.CONSUMED and x.id not in ack_count)
    if unacked:
        r.breaches.append(f"CONSUMED rows without an ACK event: {_ids(unacked)}")

    r.checkpoints = dict(Counter(x.status for x in cps))
    completed = {x.version_num: x for x in cps if x.status == "COMPLETED"}
    r.versions = [x.version_num for x in cps if x.status == "COMPLETED"]
    not_durable = []
    for a in acks:
        v = int(a.reason[1:]) if a.reason and a.reason.startswith("v") else None
        ck = completed.get(v) if v is not None else None
        if ck is None or not ck.path or not Path(ck.path).exists():
            not_durable.append(a.row_id)
    if not_durable:
        r.breaches.append(
            "rows acknowledged without a durable COMPLETED checkpoint holding them: "
            f"{_ids(sorted(set(not_durable)))}"
        )
    r.breaches += _lineage_breaches(list(completed.values()), state)
    if snap:
        r.max_staleness = json.loads(snap).get("curation", {}).get("max_staleness")
    lineage = Lineage(
        max((x.version_num for x in cps), default=0),
        frozenset(x.version_num for x in cps if x.status == "DISCARDED"),
    )
    r.breaches += _staleness_breaches(r, list(completed.values()), rows, lineage)
    published = [x.version_num for x in cps if x.status != "FAILED"]
    if any(b <= a for a, b in pairwise(published)):
        r.breaches.append(f"checkpoint versions did not only go up: {published}")
    return r


def _lineage_breaches(completed: list[sa.Row], state: dict[int, int]) -> list[str]:  # type: ignore[type-arg]
    """Rows trained into two durable checkpoints, and consumed rows in none, from the
    lineage each checkpoint's trainer_state.json records."""
    owner: dict[int, int] = {}
    twice: list[int] = []
    complete = True
    for ck in completed:
        f = Path(ck.path, "trainer_state.json") if ck.path else None
        if f is None or not f.is_file():
            continue  # a COMPLETED version without files (save_every > 1)
        d = json.loads(f.read_text())
        if "rows" not in d:
            complete = False  # written before checkpoints recorded their lineage
            continue
        for rid in d["rows"]:
            if rid in owner:
                twice.append(rid)
            owner.setdefault(rid, ck.version_num)
    out = []
    if twice:
        out.append(
            "rows in the lineage of two durable checkpoints (trained into both): "
            f"{_ids(sorted(set(twice)))}"
        )
    orphans = sorted(i for i, st in state.items() if st == RowState.CONSUMED and i not in owner)
    if complete and owner and orphans:
        out.append(f"CONSUMED rows in no durable checkpoint's lineage: {_ids(orphans)}")
    return out


def _staleness_breaches(
    r: AuditReport,
    completed: list[sa.Row],  # type: ignore[type-arg]
    rows: list[sa.Row],  # type: ignore[type-arg]
    lineage: Lineage,
) -> list[str]:
    """Trained rows beyond the bound, from the lineages' `trained_at` (the version of the
    weights that trained each row) and each row's version (by distance, if discarded)."""
    version = {x.id: x.version_num for x in rows}
    lags: Counter[int] = Counter()
    beyond: list[int] = []
    for ck in completed:
        f = Path(ck.path, "trainer_state.json") if ck.path else None
        if f is None or not f.is_file():
            continue
        for v, rids in json.loads(f.read_text()).get("trained_at", {}).items():
            for rid in rids:
                if rid not in version:
                    continue
                lag = int(v) - lineage.effective(version[rid], at=int(v))  # as it was then
                lags[lag] += 1
                if r.max_staleness is not None and lag > r.max_staleness:
                    beyond.append(rid)
    r.trained_lags = dict(sorted(lags.items()))
    if not beyond:
        return []
    return [f"rows trained beyond the staleness bound ({r.max_staleness}): {_ids(sorted(beyond))}"]


def render(r: AuditReport) -> str:
    lines = [
        f"audit of run {r.run_id}: {'OK' if r.ok else 'BREACHED'}",
        f"  episodes started   {r.episodes_started}"
        + (f" ({r.in_flight} still in flight)" if r.in_flight else ""),
        "  trajectories       "
        + (", ".join(f"{k} {v}" for k, v in sorted(r.trajectories.items())) or "none"),
        "  rows by state      "
        + (", ".join(f"{k} {v}" for k, v in sorted(r.states.items())) or "none"),
        "  dropped by reason  "
        + (", ".join(f"{k} {v}" for k, v in sorted(r.drops.items())) or "none"),
        "  quarantined        "
        + (", ".join(f"{k} {v}" for k, v in sorted(r.quarantined.items())) or "none"),
        f"  acknowledgements   {r.acks}",
        f"  checkpoints        {', '.join(f'{k} {v}' for k, v in sorted(r.checkpoints.items())) or 'none'}",
        f"  durable versions   {r.versions}",
        "  trained lag        "
        + (
            ", ".join(f"{k}: {v}" for k, v in r.trained_lags.items())
            + (f" (bound {r.max_staleness})" if r.max_staleness is not None else "")
            if r.trained_lags
            else "not recorded"
        ),
    ]
    lines += [f"  BREACH: {b}" for b in r.breaches]
    return "\n".join(lines)
