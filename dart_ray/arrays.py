"""Read-only number sequences over Arrow buffers, and the Arrow list columns made from them.

Token ids, behaviour log-probs, entropies and token versions travel from a trajectory's
Parquet blob (`STEP_SCHEMA`) to the curator's packed batches (`SAMPLE_SCHEMA`) and on to the
trainer's tensors. As tuples, every token became a Python object on read (`to_pylist`) and was
taken apart again on pack (`pa.array` of nested lists), and a held trajectory took about ten
times the memory of its numbers. Here a list column is read as one numpy view per row, with no
copy (`list_views`), and rows of any kind are packed back into a list column with one copy
per row (`list_array`): offsets from the lengths, values from the concatenated buffers.

`ArraySeq` is the record-side form: an immutable `Sequence` over a read-only 1-D numpy array.
It equals (and hashes like) the tuple of the same numbers, so a `Step` read back from a blob
equals the one the rollouter built from tuples; its items are Python numbers, as a tuple's
are; `np.asarray(seq)` is the array itself, without a copy.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import accumulate, pairwise
from typing import Any, SupportsIndex, overload

import numpy as np
import pyarrow as pa


class ArraySeq(Sequence[Any]):
    """An immutable sequence of numbers backed by a read-only numpy array (often a view of an
    Arrow buffer). Equal to a tuple with equal items, as tuples are to each other."""

    __slots__ = ("_a",)

    def __init__(self, values: Any) -> None:
        a = np.asarray(values)
        if a.ndim != 1:
            raise ValueError(f"ArraySeq takes a 1-D array, got shape {a.shape}")
        if a.flags.writeable and (a is values or a.base is not None):
            a = a.copy()  # the caller's memory, which it may still write to: keep our own
        self._a = _frozen(a)

    @classmethod
    def _of(cls, a: np.ndarray) -> ArraySeq:
        """Wrap an array that is already read-only (no checks, no copy)."""
        s = cls.__new__(cls)
        s._a = a
        return s

    def __len__(self) -> int:
        return len(self._a)

    @overload
    def __getitem__(self, i: SupportsIndex) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> ArraySeq: ...
    def __getitem__(self, i: SupportsIndex | slice) -> Any:
        if isinstance(i, slice):
            return ArraySeq._of(self._a[i])
        return self._a[i].item()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._a.tolist())

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return np.array(self._a, dtype=dtype, copy=copy)  # no copy unless asked or needed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArraySeq):
            return len(self._a) == len(other._a) and bool((self._a == other._a).all())
        if isinstance(other, tuple):
            return len(self._a) == len(other) and self._a.tolist() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._a.tolist()))

    def __repr__(self) -> str:
        return f"ArraySeq({self._a.tolist()!r}, {self._a.dtype})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unpickle, (self._a,))


_ARRAYS = (ArraySeq, np.ndarray)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _unpickle(a: np.ndarray) -> ArraySeq:
    return ArraySeq._of(_frozen(a))  # a fresh array of pickle's: nobody else holds it


def list_views(col: pa.Array | pa.ChunkedArray) -> list[ArraySeq]:
    """One `ArraySeq` per row of a list column of numbers, each a view of the column's value
    buffer (no copy; a null row reads as empty)."""
    if isinstance(col, pa.ChunkedArray):
        if col.num_chunks != 1:
            return [s for chunk in col.chunks for s in list_views(chunk)]
        col = col.chunk(0)
    offsets = col.offsets.to_numpy().tolist()  # the slice's own, into the unsliced values
    values = _frozen(col.values.to_numpy(zero_copy_only=False))  # a view unless nulls
    out = [ArraySeq._of(values[a:b]) for a, b in pairwise(offsets)]
    if col.null_count:
        empty = ArraySeq._of(values[:0])
        valid = col.is_valid().to_numpy(zero_copy_only=False).tolist()
        out = [s if ok else empty for s, ok in zip(out, valid, strict=True)]
    return out


def list_array(rows: Sequence[Sequence[Any]], list_type: pa.ListType) -> pa.ListArray:
    """A list column of `list_type` whose row i holds `rows[i]`.

    Rows that are arrays (`ArraySeq`, numpy) are concatenated once, with offsets from their
    lengths: no Python object per item. Rows that are all tuples or lists (a generation's,
    already Python objects) go to `pa.array`, which converts them in one pass."""
    if not any(isinstance(r, _ARRAYS) for r in rows):
        return pa.array(rows, type=list_type)
    dtype = list_type.value_type.to_pandas_dtype()
    parts = [_as_array(r, dtype) for r in rows]
    offsets = pa.array(list(accumulate(map(len, parts), initial=0)), pa.int32())
    values = pa.array(np.concatenate(parts))
    return pa.ListArray.from_arrays(offsets, values, type=list_type)


def _as_array(values: Sequence[Any], dtype: type) -> np.ndarray:
    """`values` as a 1-D array of `dtype`: no copy for an array of that type; a tuple's items
    converted one by one (an int out of `dtype`'s range is refused, as `pa.array` does)."""
    if isinstance(values, _ARRAYS):
        return np.asarray(values, dtype=dtype)
    return np.fromiter(values, dtype, len(values))
