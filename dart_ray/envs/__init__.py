"""GUI environments: the contract (`base`), and one room per kind: MiniDesk (`minidesk/`),
MiniWoB++ (`miniwob/`), OSWorld's protocol, tasks and evaluators (`osworld/`) and our own
desktop that speaks it (`desktop/`).

At the top: `base` (the contract and the registry of kinds), `taskfile` (task files, and
what makes two tasks the same), `suites` (a config's splits), `pyautogui_code` (UI-TARS
actions as pyautogui code), `latency` (MiniDesk behind simulated latencies). Import concrete
environments from their modules; `base.make_env(config)` resolves the kind."""
