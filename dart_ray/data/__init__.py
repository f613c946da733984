"""The data side of training: from logged trajectories to curated, packed step samples.

- `curation`: one GRPO group -> step samples with advantages (replay, selection, drops).
- `grouping`: collects claimed trajectories into complete groups (or timed-out partial ones).
- `batches`: Arrow RecordBatches, token-balanced across trainer ranks.
"""
