"""Measuring a policy: held-out success, pass@k, and the probes of what it represents.

- `suite`: the success rate of a served policy on a task suite (greedy, or k samples for
  pass@k); what a run measures before and after training.
- `local`: `dart-ray eval` in one process (a local engine, environments in threads), the
  same episode code without Ray or Serve.
- `probes`: linear probes and attention reads that locate where grounding fails.

May import envs, engines, models, rollout and records; not the run or reporting.
"""
