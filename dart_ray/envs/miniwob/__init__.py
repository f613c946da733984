"""MiniWoB++ in offline headless Chromium (PyPI `miniwob`, the `browser` extra).

- `env`: `MiniWobEnv`, one browser, a task's page and seed, UI-TARS actions as MiniWoB's;
- `keys`: the keys a UI-TARS hotkey may press there;
- `oracle`: a scripted solver of the rung's pages (warm starts, task files, tests);
- `tasks`: the rung's task files (training, validation and held-out seeds).

May import envs.base, config and records; nothing of the run, the trainer or the policy.
"""
