"""Writes cluster/grafana/dart-ray-dashboard.json, the Grafana dashboard of a dart-ray run.

    python cluster/grafana/build_dashboard.py

Panels on our metrics (Prometheus names: Ray prefixes `ray_`, and a counter's name ends in
`_total`), on Ray's own Serve and node metrics, and two tables read from the durable log
through a MySQL data source. tests/cluster/test_grafana.py keeps the JSON equal to what this
prints and every metric name real.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).with_name("dart-ray-dashboard.json")
PROM = {"type": "prometheus", "uid": "${prometheus}"}
LOG = {"type": "mysql", "uid": "${log}"}
RUN = 'run_id="$run_id"'

BUFFER_SQL = (
    "SELECT version_num AS version, "
    "SUM(CASE WHEN state = 0 THEN 1 ELSE 0 END) AS available, "
    "SUM(CASE WHEN state = 1 THEN 1 ELSE 0 END) AS claimed, "
    "SUM(CASE WHEN state = 2 THEN 1 ELSE 0 END) AS consumed, "
    "SUM(CASE WHEN state = 3 THEN 1 ELSE 0 END) AS dropped "
    "FROM rollout_run WHERE run_id = '$run_id' GROUP BY version_num ORDER BY version_num"
)
TASK_SQL = (
    "SELECT task_id, attempts, successes, "
    "ROUND(1.0 * successes / attempts, 3) AS success_rate, failures_env "
    "FROM task_stats WHERE run_id = '$run_id' AND attempts > 0 ORDER BY success_rate, task_id"
)


def series(title: str, unit: str, desc: str, *exprs: tuple[str, str]) -> dict[str, Any]:
    targets = [
        {"refId": chr(65 + i), "datasource": PROM, "expr": e, "legendFormat": legend}
        for i, (e, legend) in enumerate(exprs)
    ]
    return {
        "type": "timeseries",
        "title": title,
        "description": desc,
        "datasource": PROM,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": targets,
    }


def table(title: str, sql: str, desc: str) -> dict[str, Any]:
    target = {
        "refId": "A",
        "datasource": LOG,
        "format": "table",
        "rawQuery": True,
        "editorMode": "code",
        "rawSql": sql,
    }
    return {
        "type": "table",
        "title": title,
        "description": desc,
        "datasource": LOG,
        "targets": [target],
    }


def panels() -> list[dict[str, Any]]:
    serve = 'deployment="PolicyServer"'
    return [
        # rollout and environments
        series(
            "Trajectories logged per second, by status",
            "ops",
            "Every finished episode; ABORTED are retried, ENV_ERROR groups are not trained.",
            (f"sum by (status) (rate(ray_dart_trajectories_total{{{RUN}}}[5m]))", "{{status}}"),
        ),
        series(
            "Episodes in flight",
            "short",
            "Episodes running now over all rollouters (at most rollout.in_flight each).",
            (f"sum(ray_dart_trajectories_in_flight{{{RUN}}})", "in flight"),
        ),
        series(
            "Environment utilisation",
            "percentunit",
            "DART-GUI's environment utilisation: the share of session time spent working.",
            (f"avg(ray_dart_env_utilisation{{{RUN}}})", "in episodes (rollouter)"),
            ("avg by (kind) (rate(ray_dart_env_busy_seconds_total[5m]))", "in env calls, {{kind}}"),
        ),
        series(
            "Environment sessions alive",
            "short",
            "Grows with env.max_sessions as the autoscaler adds env nodes.",
            ("count by (kind) (ray_dart_env_session_busy_fraction)", "{{kind}}"),
        ),
        series(
            "Mean reward of recent trajectories",
            "short",
            "The last 100 trainable trajectories of each rollouter.",
            (f"avg(ray_dart_reward_mean{{{RUN}}})", "mean reward"),
        ),
        # the buffer
        series(
            "Unused buffer and what the curator holds",
            "short",
            "Rows logged and not yet claimed; claimed rows and curated steps waiting for the "
            "trainer. A growing unused buffer means the trainer falls behind.",
            (f"max(ray_dart_buffer_unused_rows{{{RUN}}})", "unused rows"),
            (f"max(ray_dart_curator_held_rows{{{RUN}}})", "held rows"),
            (f"max(ray_dart_curator_queue_depth{{{RUN}}})", "queued steps"),
        ),
        series(
            "Staleness of claimed rows",
            "short",
            "Mean number of versions between generation and claim (curation.max_staleness).",
            (f"max(ray_dart_staleness_mean{{{RUN}}})", "mean lag (versions)"),
        ),
        series(
            "Rows dropped, by reason",
            "short",
            "Rows the curator did not train, and why.",
            (f"max by (reason) (ray_dart_dropped_rows{{{RUN}}})", "{{reason}}"),
        ),
        # the trainer and weights
        series(
            "Trainer throughput",
            "short",
            "Response tokens trained per second of optimizer step, and optimizer steps a minute.",
            (f"max(ray_dart_train_tokens_per_s{{{RUN}}})", "tokens/s"),
            (f"sum(rate(ray_dart_train_steps_total{{{RUN}}}[5m])) * 60", "steps/min"),
        ),
        series(
            "Policy version and trainer utilisation",
            "short",
            "Newest published version; share of the trainer's life in steps and syncs.",
            (f"max(ray_dart_policy_version{{{RUN}}})", "version"),
            (f"max(ray_dart_trainer_utilisation{{{RUN}}})", "trainer utilisation"),
        ),
        series(
            "Trust region and off-policy correction",
            "percentunit",
            "Share of tokens the PPO/GSPO clip bound (0 with one update per batch), whose "
            "importance weight was capped, and that the correction dropped (docs/TRAINING.md).",
            (f"max(ray_dart_clip_fraction{{{RUN}}})", "clipped"),
            (f"max(ray_dart_is_capped_fraction{{{RUN}}})", "IS capped"),
            (f"max(ray_dart_is_masked_fraction{{{RUN}}})", "masked"),
        ),
        series(
            "Engine vs trainer log-probs",
            "short",
            "Mean |log-prob difference| on the sampled tokens and the k3 KL(behaviour || "
            "trainer): staleness plus kernel mismatch; near 0 on-policy.",
            (f"max(ray_dart_logprob_mismatch_abs{{{RUN}}})", "mean |diff|"),
            (f"max(ray_dart_logprob_mismatch_kl{{{RUN}}})", "KL k3"),
        ),
        series(
            "Weight sync latency",
            "s",
            "One publication: ray.put once, every replica loads in place.",
            (f"max(ray_dart_weight_sync_seconds{{{RUN}}})", "last sync"),
        ),
        # serving and hardware (Ray's own metrics)
        series(
            "Policy replicas: requests being processed",
            "short",
            "Autoscaling aims at policy.target_ongoing_requests per replica.",
            (f"sum by (replica) (ray_serve_replica_processing_queries{{{serve}}})", "{{replica}}"),
        ),
        series(
            "Policy latency",
            "ms",
            "One generate call (one agent step) inside a replica.",
            *(
                (
                    f"histogram_quantile({q}, sum by (le) (rate("
                    f"ray_serve_deployment_processing_latency_ms_bucket{{{serve}}}[5m])))",
                    f"p{int(q * 100)}",
                )
                for q in (0.5, 0.95)
            ),
        ),
        series(
            "GPU utilisation by node",
            "percent",
            "Policy replicas and train workers.",
            ("avg by (NodeAddress) (ray_node_gpus_utilization)", "{{NodeAddress}}"),
        ),
        # the durable log
        table(
            "Buffer by weight version (durable log)",
            BUFFER_SQL,
            "Rows of the run by state; old available versions mean the trainer falls behind.",
        ),
        table(
            "Per-task success (durable log)",
            TASK_SQL,
            "task_stats: attempts, successes and environment failures per task.",
        ),
    ]


def dashboard() -> dict[str, Any]:
    ps = panels()
    for i, p in enumerate(ps):
        p["id"] = i + 1
        p["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    runs = "label_values(ray_dart_trajectories_total, run_id)"
    return {
        "title": "dart-ray",
        "uid": "dart-ray",
        "description": "Rollout, environments, buffer, trainer, serving and the durable log "
        "of dart-ray runs (docs/OPERATIONS.md).",
        "tags": ["dart-ray", "ray"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "prometheus",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                },
                {
                    "name": "log",
                    "label": "Durable log (MySQL)",
                    "type": "datasource",
                    "query": "mysql",
                },
                {
                    "name": "run_id",
                    "label": "run",
                    "type": "query",
                    "datasource": PROM,
                    "query": {"query": runs, "refId": "run_id"},
                    "definition": runs,
                    "refresh": 2,
                    "sort": 2,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": ps,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
