"""The front end's arrays: on ordinary pages, not transparent huge pages, and
on pages malloc has already.

numpy asks the kernel for huge pages (``madvise(MADV_HUGEPAGE)``) for every
array of 4 MB or more. The front end makes and drops many arrays of one
entry per op (52 MB each at microgpt 64/4/4), each fresh memory; where
transparent huge pages are ``madvise`` (as on the VM below), faulting in a
huge page can mean compacting memory first, and in a process that holds
millions of ``Value``s that took most of each array's first fill. On the Intel
Xeon VM (model 167, KVM): one such array's first fill 0.19 s with the hint,
0.05 s without; 64/4/4's trace, passes and codegen 6.98-7.81 s with it,
6.50-6.63 s without (kernel time 2.6-3.1 -> 2.0 s). ``small_pages()`` turns
the hint off while the front end runs and puts numpy's setting back after;
the arrays the compiled model keeps are unaffected.

Those arrays are fresh memory for another reason too: glibc's malloc maps
every block above its mmap threshold (128 KB, rising with the blocks freed
to at most 32 MB) anew and unmaps it on free, and trims the top of its heap
as soon as more than twice that lies free there, so the passes' arrays
fault in and zero their pages again and again (1.5 of microgpt 64/4/4's
2.7 s of passes were the kernel's, on the Intel Xeon VM). ``heap_memory()``
has malloc serve every block from its heap and keep what is freed while
the front end runs, so that the passes reuse the pages the trace's arrays
were given: 64/4/4's passes 2.4-3.1 -> 1.4 s there. After, malloc is left
as its dynamic threshold leaves it after any free of a block of 32 MB or
more (mmap above 32 MB, trim above 64 MB), and ``malloc_trim(0)`` hands
what the front end freed back to the kernel.
"""
import contextlib
import ctypes
import os
import threading

import numpy as np


def _multiarray_with_hint():
    """numpy's ``multiarray`` (``numpy._core``'s in numpy 2, ``numpy.core``'s
    in numpy 1), or None where it has no huge-page hint."""
    for package in ('_core', 'core'):
        multiarray = getattr(getattr(np, package, None), 'multiarray', None)
        if hasattr(multiarray, '_set_madvise_hugepage'):
            return multiarray
    return None


_multiarray = _multiarray_with_hint()
_set_hint = getattr(_multiarray, '_set_madvise_hugepage', None)

_lock = threading.Lock()


class _Held:
    """A setting held while any of its blocks runs, nested or in other
    threads at once: ``enter()`` as the first block starts, ``leave()``
    with what it returned as the last one ends."""

    def __init__(self, enter, leave):
        self._enter, self._leave = enter, leave
        self._depth, self._saved = 0, None

    @contextlib.contextmanager
    def held(self):
        with _lock:
            self._depth += 1
            if self._depth == 1:
                self._saved = self._enter()
        try:
            yield
        finally:
            with _lock:
                self._depth -= 1
                if self._depth == 0:
                    self._leave(self._saved)


_no_hint = _Held(lambda: _set_hint(False), _set_hint) if _set_hint else None


@contextlib.contextmanager
def small_pages():
    """Inside: new numpy arrays without the huge-page hint. Nesting and
    threads are fine: the first to enter saves numpy's setting, the last
    to leave restores it."""
    if _no_hint is None:
        yield
        return
    with _no_hint.held():
        yield


# mallopt's parameters (glibc's malloc.h) and what heap_memory() sets them to
# inside and after.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_INSIDE = ((_M_MMAP_THRESHOLD, 1 << 30), (_M_TRIM_THRESHOLD, (1 << 31) - 1))
_AFTER = ((_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 64 << 20))
# The user's own settings of those, which heap_memory() then leaves alone.
_MALLOC_ENV = ('MALLOC_MMAP_THRESHOLD_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_MMAP_MAX_')


def _glibc_malloc():
    """glibc's ``(mallopt, malloc_trim)``, or None under another C library."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version       # glibc's alone
        return libc.mallopt, libc.malloc_trim
    except (OSError, AttributeError):
        return None


_malloc = _glibc_malloc()


def _tune_malloc(settings, trim=False):
    mallopt, malloc_trim = _malloc
    for param, value in settings:
        mallopt(param, value)
    if trim:
        malloc_trim(0)


_kept_heap = _Held(lambda: _tune_malloc(_INSIDE), lambda _: _tune_malloc(_AFTER, trim=True)) if _malloc else None


def user_tuned_malloc():
    """Whether ``$MALLOC_*`` or ``$GLIBC_TUNABLES`` tune glibc's malloc."""
    return (any(name in os.environ for name in _MALLOC_ENV)
            or 'glibc.malloc.' in os.environ.get('GLIBC_TUNABLES', ''))


@contextlib.contextmanager
def heap_memory():
    """Inside: malloc (glibc's) serves every block below 1 GB from its heap
    and keeps what is freed there, for the next blocks. Nothing changes
    under another C library, or where the user tunes malloc
    (``user_tuned_malloc()``). Nests, across threads too; the last to leave
    sets malloc as the module's docstring says and trims the heap."""
    if _kept_heap is None or user_tuned_malloc():
        yield
        return
    with _kept_heap.held():
        yield
