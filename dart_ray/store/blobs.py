"""Trajectory blobs: one Parquet file per trajectory, one row per step, on any pyarrow.fs.

The log row holds the blob's URI; the blob holds everything the trainer needs (token ids,
behaviour log-probs, the screenshot each step acted on). Writes are atomic: on a local or
POSIX-like filesystem the file is written under a temporary name and renamed into place; on
object stores (S3, GCS) an object only becomes visible once its upload completes. Either way a
reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from dart_ray.records import Trajectory, trajectory_from_table, trajectory_to_table

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _path_component(s: str) -> str:
    """A file-name-safe, collision-free form of an arbitrary id (task ids can hold anything)."""
    cleaned = _SAFE.sub("_", s)[:64].strip("._") or "x"
    if cleaned == s:
        return s
    return f"{cleaned}-{hashlib.sha1(s.encode()).hexdigest()[:10]}"


class BlobStore:
    """Reads and writes trajectory Parquet files under one base URI."""

    def __init__(self, uri: str | Path) -> None:
        uri = str(uri)
        if "://" not in uri:
            uri = str(Path(uri).expanduser().resolve())
        try:
            self.fs, self.base = pafs.FileSystem.from_uri(uri)
        except (ValueError, OSError) as e:
            raise ValueError(f"store.blob_uri {uri!r}: {e}") from None
        self._local = isinstance(self.fs, pafs.LocalFileSystem)
        self._uri_prefix = "" if self._local else uri[: uri.index("://") + 3]
        if self._local:
            self.fs.create_dir(self.base, recursive=True)

    def path_for(self, t: Trajectory) -> str:
        return "/".join(
            [
                self.base.rstrip("/"),
                _path_component(t.run_id),
                _path_component(t.task.task_id),
                f"{_path_component(t.trajectory_id)}.parquet",
            ]
        )

    def uri_of(self, path: str) -> str:
        return path if self._local else self._uri_prefix + path

    def write(self, t: Trajectory) -> str:
        """Write a trajectory; returns the URI to log. Rewriting the same trajectory is safe."""
        path = self.path_for(t)
        table = trajectory_to_table(t)
        parent = path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        if self._local:
            tmp = f"{parent}/.tmp-{uuid.uuid4().hex}.parquet"
            try:
                pq.write_table(table, tmp, filesystem=self.fs, compression="zstd")
                self.fs.move(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    self.fs.delete_file(tmp)
                raise
        else:
            pq.write_table(table, path, filesystem=self.fs, compression="zstd")
        return self.uri_of(path)

    def read(self, uri: str) -> Trajectory:
        """Read a trajectory back from the URI `write` returned."""
        return trajectory_from_table(self.read_table(uri))

    def read_table(self, uri: str) -> pa.Table:
        """The blob's `STEP_SCHEMA` table, metadata included.

        One file, read with `ParquetFile`: `pq.read_table` goes through the dataset layer
        (discovery, partitioning), about a third of a small blob's read. `pre_buffer`, as
        `read_table` has it, coalesces the column reads into few requests on object stores."""
        if "://" not in uri:
            fs, path = self.fs, uri
        elif self._uri_prefix and uri.startswith(self._uri_prefix):
            fs, path = self.fs, uri[len(self._uri_prefix) :]
        else:
            fs, path = pafs.FileSystem.from_uri(uri)
        try:
            with fs.open_input_file(path) as f:
                return pq.ParquetFile(f, pre_buffer=True).read()
        except FileNotFoundError:
            raise FileNotFoundError(f"trajectory blob {uri} does not exist") from None
