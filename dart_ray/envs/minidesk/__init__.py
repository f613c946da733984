"""MiniDesk: a deterministic synthetic desktop drawn with PIL (the embedded default env).

`env.MiniDeskEnv` is the environment, `families` generates tasks from seeds, `oracle` solves
them, `tasks/*.jsonl` ship the generated train and held-out splits (`python -m
dart_ray.envs.minidesk.generate` rewrites them)."""
