"""The data side of training: from logged trajectories to curated, packed step samples.

- `curation`: one GRPO group -> step samples with advantages (replay, selection, drops), or
  with `objective = "rft"` its successes alone.
- `grouping`: collects claimed trajectories into complete groups (or timed-out partial ones).
- `curator`: the curator's core (claim -> group -> curate -> pack -> queue -> ack); its
  records in `steps`, its staleness bound in `staleness`, the trainer's pace for admission
  in `pace`.
- `batches`: Arrow RecordBatches, token-balanced across trainer ranks.

May import algo, store, rollout.admission and records; not the run, the trainer or Ray.
"""
