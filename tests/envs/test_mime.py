"""The default application for a file, from a desktop user's freedesktop.org files."""

from __future__ import annotations

from pathlib import Path

from dart_ray.envs.desktop.mime import default_command, mime_type


def _entry(apps: Path, name: str, exec_line: str) -> None:
    apps.mkdir(parents=True, exist_ok=True)
    (apps / name).write_text(f"[Desktop Entry]\nType=Application\nName={name}\nExec={exec_line}\n")


def _tree(tmp_path: Path) -> tuple[dict[str, str], Path]:
    home = tmp_path / "home"
    system = tmp_path / "usr-share"
    apps = system / "applications"
    _entry(apps, "libreoffice-calc.desktop", "libreoffice --calc %U")
    _entry(apps, "gimp.desktop", "gimp-2.10 %U")
    _entry(apps, "eog.desktop", "eog %U")
    _entry(apps, "vlc.desktop", "/usr/bin/vlc --started-from-file %U")
    (apps / "mimeinfo.cache").write_text(
        "[MIME Cache]\n"
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet="
        "libreoffice-calc.desktop;\n"
        "image/png=eog.desktop;gimp.desktop;\n"
        "video/mp4=vlc.desktop;\n"
    )
    env = {"XDG_DATA_DIRS": str(system), "XDG_CONFIG_DIRS": str(tmp_path / "etc-xdg")}
    return env, home


def test_the_packages_associations_pick_the_application(tmp_path: Path) -> None:
    env, home = _tree(tmp_path)
    sheet = tmp_path / "Budget 2024.xlsx"
    assert default_command(sheet, env, home) == ["libreoffice", "--calc", str(sheet)]
    video = tmp_path / "a.mp4"
    assert default_command(video, env, home) == ["/usr/bin/vlc", "--started-from-file", str(video)]
    assert default_command(tmp_path / "a.png", env, home) == ["eog", str(tmp_path / "a.png")]


def test_the_users_default_wins_and_an_unknown_type_has_none(tmp_path: Path) -> None:
    env, home = _tree(tmp_path)
    (home / ".config").mkdir(parents=True)
    (home / ".config" / "mimeapps.list").write_text(
        "[Default Applications]\nimage/png=gimp.desktop\n"
    )
    png = tmp_path / "a.png"
    assert default_command(png, env, home) == ["gimp-2.10", str(png)]
    assert default_command(tmp_path / "a.xyz-unknown", env, home) is None


def test_a_name_without_a_known_type_is_text_when_it_holds_text(tmp_path: Path) -> None:
    (tmp_path / "notes").write_text("buy milk\n")
    (tmp_path / "blob").write_bytes(b"\x00\x01")
    assert mime_type(tmp_path / "notes") == "text/plain"
    assert mime_type(tmp_path / "blob") == "application/octet-stream"
