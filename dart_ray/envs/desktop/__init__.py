"""A real X desktop behind the OSWorld in-VM HTTP protocol, for machines without OSWorld's VMs.

`machine` runs Xvfb, a window manager and Debian applications with a fresh HOME per reset;
`spawn` starts the server (confined in a mount namespace on request);
`xwindows` reads the window tree; `protocol` implements the OSWorld operations (its set-up
steps in `setup_steps`, requests and replies in `requests`) and `server`
serves them over HTTP (`python -m dart_ray.envs.desktop.server`); `pool` leases desktops like
GUI-Docker-Env; `suite` is the desktop task suite. The client side (the Env) is
`dart_ray.envs.osworld.env`, which talks to this server and to real OSWorld VMs alike."""
