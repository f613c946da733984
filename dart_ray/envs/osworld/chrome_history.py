"""An empty Chrome History database, made offline, for OSWorld's `update_browse_history`.

OSWorld's SetupController (`_update_browse_history_setup`) starts from an empty History
database that it downloads from Hugging Face (`history_empty.sqlite`) into
`<cache_dir>/history_new.sqlite`, unless that file is already there. It then inserts the task's
`urls` and `visits` rows into a copy and uploads the copy to the VM's Chrome profile,
`$HOME/.config/google-chrome/Default/History` on Linux (HOME as the desktop's Python sees it;
the snap Chromium path on an ARM client). Offline, the download fails and the step raises.

`make_history_template` makes that file from the Chromium on this machine instead: a headless
Chromium with a throwaway profile creates `Default/History` with its own schema, and every row
of it is deleted (the `meta` table, which holds the schema version, stays). The schema is then
the one the desktop's Chromium expects, so it opens the uploaded file as its own.

    python -m dart_ray.envs.osworld.chrome_history osworld-cache/<task id>/history_new.sqlite

(`DesktopEnv` gives each task the cache folder `<cache_dir>/<task id>`.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path

CHROMIUMS = ("chromium", "chromium-browser", "google-chrome")
KEEP = {"meta"}  # the schema version Chromium checks on open


def find_chromium() -> str:
    """The first of CHROMIUMS on PATH; FileNotFoundError naming them if none is."""
    for name in CHROMIUMS:
        path = shutil.which(name)
        if path is not None:
            return path
    raise FileNotFoundError(f"no Chromium on PATH (tried {', '.join(CHROMIUMS)})")


def make_history_template(dest: Path, chromium: str | None = None, timeout_s: float = 60) -> Path:
    """Write an empty History database made by `chromium` to `dest` (parents created)."""
    binary = chromium or find_chromium()
    with tempfile.TemporaryDirectory(prefix="chrome-history-") as tmp:
        profile = Path(tmp) / "profile"
        cmd = [
            binary,
            "--headless",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={profile}",
            *(["--no-sandbox"] if os.geteuid() == 0 else []),  # Chromium refuses root without
            "--dump-dom",  # load the page, print it and exit
            "about:blank",  # a page that History does not record
        ]
        subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=True)
        made = profile / "Default" / "History"
        if not made.exists():
            raise RuntimeError(f"{binary} made no {made.relative_to(profile)} in its profile")
        work = Path(tmp) / "History"
        shutil.copyfile(made, work)
        _empty(work)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(work, dest)
    return dest


def _empty(db: Path) -> None:
    """Delete every row but the schema's version; check the tables OSWorld writes exist."""
    conn = sqlite3.connect(db)
    try:
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        missing = {"urls", "visits"} - tables
        if missing:
            raise RuntimeError(f"{db}: no table {', '.join(sorted(missing))} (not a History db)")
        for name in sorted(tables - KEEP):
            conn.execute(f'DELETE FROM "{name}"')
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("dest", type=Path, help="where to write it: <task cache dir>/history_new.sqlite")
    p.add_argument("--chromium", help=f"the browser binary (default: first of {CHROMIUMS})")
    args = p.parse_args(argv)
    print(make_history_template(args.dest, args.chromium))


if __name__ == "__main__":
    main()
