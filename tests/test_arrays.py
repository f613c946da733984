"""Number sequences over Arrow buffers: tuple-like records, views without copies, and list
columns built from offsets."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

from dart_ray.arrays import ArraySeq, list_array, list_views

INT_LISTS = pa.list_(pa.int32())
FLOAT_LISTS = pa.list_(pa.float32())


def test_an_array_seq_is_the_tuple_of_its_numbers() -> None:
    s = ArraySeq(np.array([-0.5, -1.0, -1.5], np.float32))
    t = (-0.5, -1.0, -1.5)
    assert s == t and t == s and s == ArraySeq(np.array(t))  # both sides, any dtype
    assert s != (-0.5, -1.0) and s != (-0.5, -1.0, -1.25) and s != [-0.5, -1.0, -1.5]
    assert hash(s) == hash(t) and {s: 1}[t] == 1
    assert len(s) == 3 and list(s) == [-0.5, -1.0, -1.5] and s[-1] == -1.5
    assert type(s[0]) is float and type(ArraySeq(np.array([7], np.int32))[0]) is int
    assert s[1:] == (-1.0, -1.5) and isinstance(s[1:], ArraySeq)
    assert bool(ArraySeq(np.array([], np.int64))) is False and ArraySeq(np.array([])) == ()
    assert max(ArraySeq(np.array([3, 4, 4])), default=0) == 4 and -1.0 in s


def test_an_array_seq_cannot_be_changed_through_its_array() -> None:
    source = np.array([1, 2, 3], np.int32)
    s = ArraySeq(source)
    source[0] = 99  # the caller's array was copied, not shared
    assert s == (1, 2, 3)
    with pytest.raises(ValueError, match="read-only"):
        np.asarray(s)[0] = 5
    back = pickle.loads(pickle.dumps(s))
    assert back == s and not np.asarray(back).flags.writeable
    with pytest.raises(ValueError, match="1-D"):
        ArraySeq(np.zeros((2, 2)))


def test_list_views_are_the_rows_without_a_copy() -> None:
    col = pa.array([[1, 2, 3], [], [4, 5]], INT_LISTS)
    views = list_views(col)
    assert views == [(1, 2, 3), (), (4, 5)]
    # each view lies in the column's value buffer: values 4, 5 start 3 int32s (12 bytes) in
    data = col.values.buffers()[1]
    assert np.asarray(views[2]).ctypes.data == data.address + 12
    # a slice (a micro-batch) reads its own rows; chunks read in order; a null row is empty
    assert list_views(col.slice(1, 2)) == [(), (4, 5)]
    chunked = pa.chunked_array([col, pa.array([[6]], INT_LISTS)])
    assert list_views(chunked) == [(1, 2, 3), (), (4, 5), (6,)]
    assert list_views(pa.array([[1], None, [2]], INT_LISTS)) == [(1,), (), (2,)]


def test_list_array_packs_tuples_and_views_alike() -> None:
    """Rows from a generation (tuples) and rows read back from a blob (views) give the
    column `pa.array` gives for the same lists, offsets [0, 2, 2, 3]."""
    rows = [(-0.5, -1.0), (), (-1.5,)]
    want = pa.array([list(r) for r in rows], FLOAT_LISTS)
    views = list_views(want)
    assert list_array(rows, FLOAT_LISTS).equals(want)
    assert list_array(views, FLOAT_LISTS).equals(want)
    mixed = list_array([views[0], (), views[2]], FLOAT_LISTS)
    assert mixed.equals(want) and mixed.offsets.to_pylist() == [0, 2, 2, 3]
    assert list_array([], INT_LISTS).equals(pa.array([], INT_LISTS))
    with pytest.raises(OverflowError):  # a token id out of int32 is refused, not wrapped
        list_array([ArraySeq(np.array([1])), (2**40,)], INT_LISTS)


def test_an_array_seq_hands_numpy_its_array_without_a_copy_unless_asked() -> None:
    s = ArraySeq(np.array([1, 2, 3], np.int32))
    assert np.asarray(s) is np.asarray(s)  # the same read-only array each time
    assert np.asarray(s, dtype=np.int64).tolist() == [1, 2, 3]
    owned = np.array(s, copy=True)
    owned[0] = 7  # a copy is the caller's to write
    assert s == (1, 2, 3)
    with pytest.raises(ValueError):
        np.asarray(s, dtype=np.float64, copy=False)  # a cast needs a copy: refused
    assert ArraySeq((4, 5)) == (4, 5)  # from a tuple: the fresh array is kept as is
