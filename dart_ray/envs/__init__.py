"""GUI environments: the contract (`base`), MiniDesk, MiniWoB++ and OSWorld-protocol desktops.

Import concrete environments from their modules; `base.make_env(config)` resolves the kind."""
