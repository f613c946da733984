"""The run: `dart-ray train` from the command line to the final report.

- `preflight`: Ray started or joined, and the checks that fail a run in one line before
  anything starts (the model folder, the port, every secret the config names).
- `runtime`: starts every part of a run (the log, the policy server, sessions, rollouters,
  curator, trainer) and stops them.
- `driver`: the main loop in one screen, decoupled or synchronous (a full batch per round,
  or dynamic sampling).
- `command`: the `train`, `sft` and `eval` subcommands with their progress display.
- `experiment`: `dart-ray experiment`, arms x seeds of runs measured before and after on the
  same held-out tasks, with intervals.
- `serving`: `dart-ray serve`, the policy alone.

The top of the house: it may import every other package of dart-ray and `actors/`,
`serve_apps/`; nothing below imports it.
"""
