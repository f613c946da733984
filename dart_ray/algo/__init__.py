"""DART's algorithm as pure functions of tensors and scalars: no Ray, no config objects.

- `advantages`: GRPO advantages per task group (trajectory-normalised; DART-GUI's
  step-weighted variant as an option).
- `losses`: token-level PPO clip with asymmetric and dual clipping, sequence-level GSPO,
  truncated importance weights against the behaviour policy, KL to a reference.
- `selection`: high-entropy step selection.
- `curriculum`: dynamic rollout budget and step limits per task; success replay.
"""
