"""OSWorld: its in-VM protocol's client side, its task files, its set-up steps and its
evaluators, for OSWorld's own VMs (or an emulator pool) and for our desktop (`envs.desktop`).

- `env`: `OSWorldEnv` (a desktop reached through the protocol) and `LocalDesktopEnv` (our
  server on a private Xvfb display, started by the env), and OSWorld task files as Tasks;
- `client`: the protocol's HTTP calls, each checked;
- `setup`: a task's `config` set-up steps through the client; `chrome`: the steps that drive
  Chrome over DevTools; `chrome_history`: the empty History database they fill; `cache`:
  OSWorld's download cache;
- `ours`: our own evaluator (the getters and metrics our desktop tasks use);
  `official`: OSWorld's own evaluator in `.venv-osworld`, through `worker` (a script of that
  venv that imports no dart_ray);
- `tasks`: OSWorld's task files converted to a suite; `coverage`: which of its tasks load,
  set up and evaluate here.

May import envs.base, envs.pyautogui_code, envs.taskfile, envs.desktop (the server it drives
locally), config and records; nothing of the run, the trainer or the policy.
"""
