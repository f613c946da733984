"""The run: `dart-ray train` from the command line to the final report.

- `runtime`: starts every part of a run (Ray, the log, the policy server, sessions,
  rollouters, curator, trainer) and stops them; the pre-flight checks.
- `driver`: the main loop in one screen, decoupled or synchronous.
- `command`: the `train`, `sft` and `eval` subcommands with their progress display.

The top of the house: it may import every other package of dart-ray and `actors/`,
`serve_apps/`; nothing below imports it.
"""
