"""The front end's temporaries: numpy's huge-page hint off while compile()'s
front end runs and back as it was after; provisional slots fixed in place."""
import numpy as np
import pytest

import compiler
from compiler import pages
from compiler.trace import _NO_OPERAND, _final_slots, _slot_fixer
from micrograd import Value

_get_hint = getattr(pages._multiarray, '_get_madvise_hugepage', None)
needs_hint = pytest.mark.skipif(pages._set_hint is None or _get_hint is None,
                                reason="this numpy has no huge-page hint")


@pytest.fixture
def hint():
    """Sets numpy's hint to a value and puts the caller's back after."""
    saved = []

    def set_to(value):
        previous = pages._set_hint(value)
        if not saved:
            saved.append(previous)
    yield set_to
    if saved:
        pages._set_hint(saved[0])


@needs_hint
@pytest.mark.parametrize('start', [True, False])
def test_the_hint_is_off_inside_and_as_it_was_after(hint, start):
    hint(start)
    with pages.small_pages():
        assert _get_hint() is False
        with pages.small_pages():           # nested: still off, and the outer one restores
            assert _get_hint() is False
        assert _get_hint() is False
    assert _get_hint() is start
    with pytest.raises(ZeroDivisionError):
        with pages.small_pages():
            1 / 0
    assert _get_hint() is start


@needs_hint
def test_compile_leaves_numpy_as_it_found_it(hint):
    hint(True)
    x, w = Value(1.5), Value(-2.0)
    y = (x * w).tanh()
    m = compiler.compile(y, [x], [w], cc='tcc')
    assert _get_hint() is True
    m.set_input([1.5])
    assert m.forward() == y.data


def test_final_slots_are_the_slot_fixers():
    rng = np.random.default_rng(7)
    provisional = rng.integers(-50, 200, size=1000)
    provisional[rng.random(1000) < 0.1] = _NO_OPERAND
    fix = _slot_fixer(60)
    want = [-1 if s == _NO_OPERAND else fix(s) for s in provisional.tolist()]
    final = _final_slots(provisional, 60)
    assert final.tolist() == want
    assert final is provisional                  # in place: the walk's array, no new one
    assert _final_slots(np.arange(5), 3).tolist() == [3, 4, 5, 6, 7]   # no leaf operand at all


needs_glibc = pytest.mark.skipif(pages._malloc is None or pages.user_tuned_malloc(),
                                 reason="not glibc's malloc, or $MALLOC_* tunes it")
BIG = 64 << 20          # above glibc's largest dynamic mmap threshold (32 MB)


def on_the_heap(nbytes=BIG):
    """Whether a new numpy block of ``nbytes`` lies in malloc's main heap
    (below the program break), not in a mapping of its own."""
    import ctypes
    sbrk = ctypes.CDLL(None).sbrk
    sbrk.restype, sbrk.argtypes = ctypes.c_void_p, [ctypes.c_long]
    block = np.empty(nbytes, dtype=np.uint8)
    return block.ctypes.data < sbrk(0)


@needs_glibc
def test_heap_memory_serves_big_blocks_from_the_heap_inside_and_maps_them_after():
    assert not on_the_heap()
    with pages.heap_memory():
        assert on_the_heap()
        with pages.heap_memory():           # nested: the inner one's end changes nothing
            assert on_the_heap()
        assert on_the_heap()
    assert not on_the_heap()
    with pytest.raises(ZeroDivisionError):
        with pages.heap_memory():
            1 / 0
    assert not on_the_heap()
    assert on_the_heap(1 << 20)             # below 32 MB: the heap, as glibc itself settles


@needs_glibc
def test_heap_memory_leaves_a_malloc_the_user_tuned_alone(monkeypatch):
    monkeypatch.setenv('MALLOC_TRIM_THRESHOLD_', str(128 << 10))
    with pages.heap_memory():
        assert not on_the_heap()


@needs_glibc
def test_compile_leaves_malloc_mapping_big_blocks():
    x, w = Value(1.5), Value(-2.0)
    m = compiler.compile((x * w).relu(), [x], [w], cc='tcc')
    assert not on_the_heap()
    m.set_input([1.5])
    assert m.forward() == 0.0
