"""Trajectory Parquet blobs: round trip, odd ids, atomic writes."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dart_ray.records import Status
from dart_ray.store.blobs import BlobStore
from tests.factories import make_trajectory


def test_round_trip_one_row_per_step(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    t = make_trajectory("traj-1", n_steps=3, reward=1.0, version=4)
    uri = store.write(t)
    assert pq.read_metadata(uri).num_rows == 3
    back = store.read(uri)
    assert back.trajectory_id == "traj-1" and back.reward == 1.0 and back.status is Status.OK
    assert [s.screenshot for s in back.steps] == [s.screenshot for s in t.steps]
    assert [list(s.prompt_ids) for s in back.steps] == [list(s.prompt_ids) for s in t.steps]
    assert all(s.weight_version == 4 for s in back.steps)


def test_file_uri_and_relative_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rel = BlobStore("rel/blobs")
    uri = rel.write(make_trajectory("a"))
    assert Path(uri).is_absolute() and Path(uri).exists()
    by_uri = BlobStore(f"file://{tmp_path}/other")
    u2 = by_uri.write(make_trajectory("b"))
    assert by_uri.read(u2).trajectory_id == "b"
    assert by_uri.read(f"file://{u2}").trajectory_id == "b"


def test_hostile_ids_stay_inside_the_store_and_do_not_collide(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    a = store.write(make_trajectory("../../etc/passwd", task_id="a/b"))
    b = store.write(make_trajectory("..__..__etc__passwd", task_id="a_b"))
    assert a != b
    for uri in (a, b):
        assert Path(uri).resolve().is_relative_to((tmp_path / "blobs").resolve())
    assert store.read(a).trajectory_id == "../../etc/passwd"


def test_failed_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = BlobStore(tmp_path / "blobs")
    t = make_trajectory("t")

    def half_write(table: object, where: str, **kw: object) -> None:
        Path(where).write_bytes(b"PAR1 half a file")  # the writer dies mid-file
        raise OSError("disk full")

    monkeypatch.setattr("dart_ray.store.blobs.pq.write_table", half_write)
    with pytest.raises(OSError, match="disk full"):
        store.write(t)
    assert [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()] == []  # no file, no temp


def test_rewrite_replaces_whole_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    uri = store.write(make_trajectory("t", n_steps=4))
    uri2 = store.write(make_trajectory("t", n_steps=1, reward=1.0))
    assert uri == uri2 and store.read(uri).num_steps == 1


def test_missing_blob_is_named(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet does not exist"):
        store.read(str(tmp_path / "nope.parquet"))
