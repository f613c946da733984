"""Which application opens a file: the desktop's default for its MIME type, as `xdg-open` finds it.

OSWorld's `/setup/open_file` opens a file with the desktop's default application, so an
`.xlsx` opens in LibreOffice Calc and a `.png` in GIMP (the VM's associations). Ours does the
same from the freedesktop.org files of the desktop's user (its `XDG_*` variables):

1. the MIME type from the file name (Python's `mimetypes`, which reads the system's
   `/etc/mime.types` where present), `text/plain` for a name it does not know that holds text;
2. the default desktop entry for it: `[Default Applications]` of `mimeapps.list` in the
   config dirs, then of `mimeapps.list` and `defaults.list` in the data dirs' `applications/`,
   then the first entry `mimeinfo.cache` lists (the Debian packages' own associations);
3. that entry's `Exec=` line, its field codes (`%f`, `%F`, `%u`, `%U`) replaced by the path
   and the others dropped.

No match is None: the caller says so instead of opening something else.
"""

from __future__ import annotations

import configparser
import mimetypes
import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path


def mime_type(path: Path) -> str:
    """The file's MIME type by its name; `text/plain` for unknown names with text content."""
    guessed, _ = mimetypes.guess_type(path.name)
    if guessed:
        return guessed
    try:
        head = path.read_bytes()[:4096]
    except OSError:
        return "application/octet-stream"
    return "application/octet-stream" if b"\0" in head else "text/plain"


def _dirs(env: Mapping[str, str], home: Path) -> tuple[list[Path], list[Path]]:
    config = [Path(env.get("XDG_CONFIG_HOME") or home / ".config")]
    config += [Path(d) for d in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":") if d]
    data = [Path(env.get("XDG_DATA_HOME") or home / ".local" / "share")]
    data += [
        Path(d) for d in (env.get("XDG_DATA_DIRS") or "/usr/local/share:/usr/share").split(":") if d
    ]
    return config, data


def _ini(path: Path) -> configparser.ConfigParser | None:
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return None
    return parser


def _listed(path: Path, section: str, mime: str) -> list[str]:
    parser = _ini(path) if path.is_file() else None
    if parser is None or not parser.has_option(section, mime):
        return []
    return [e for e in parser.get(section, mime).split(";") if e.strip()]


def _candidates(mime: str, config: list[Path], data: list[Path]) -> Iterator[str]:
    for d in config:
        yield from _listed(d / "mimeapps.list", "Default Applications", mime)
    apps = [d / "applications" for d in data]
    for a in apps:
        yield from _listed(a / "mimeapps.list", "Default Applications", mime)
        yield from _listed(a / "defaults.list", "Default Applications", mime)
    for a in apps:
        yield from _listed(a / "mimeinfo.cache", "MIME Cache", mime)


def _exec_line(entry: str, data: list[Path]) -> str | None:
    for d in data:
        file = d / "applications" / entry
        parser = _ini(file) if file.is_file() else None
        if parser is not None and parser.has_option("Desktop Entry", "Exec"):
            return parser.get("Desktop Entry", "Exec")
    return None


def default_command(path: Path, env: Mapping[str, str], home: Path) -> list[str] | None:
    """The argv that opens `path` with its default application, or None when none is set."""
    config, data = _dirs(env, home)
    for entry in _candidates(mime_type(path), config, data):
        line = _exec_line(entry.strip(), data)
        if line is None:
            continue
        argv: list[str] = []
        placed = False
        for word in shlex.split(line):
            if word in ("%f", "%F", "%u", "%U"):
                argv.append(str(path))
                placed = True
            elif not (word.startswith("%") and len(word) == 2):
                argv.append(word.replace("%%", "%"))
        return argv if placed else [*argv, str(path)]
    return None
