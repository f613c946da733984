"""The policy's protocol, UI-TARS-1.5's: what it reads and what it writes.

- `geometry`: the size a screenshot is seen at (`smart_resize`) and coordinate mapping.
- `prompts`: the computer-use prompt, the history window, chat messages.
- `actions`: the action grammar: parse (never raises on model text), map coordinates,
  turn an action into pyautogui code or environment commands.

A foundation: it imports only `dart_ray.records` and the standard library, so environments,
engines and the rollout all build on it.
"""
