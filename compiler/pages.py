"""The front end's arrays on ordinary pages, not transparent huge pages.

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
"""
import contextlib
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
_depth = 0
_saved = None


@contextlib.contextmanager
def small_pages():
    """Inside: new numpy arrays without the huge-page hint. Nesting and
    threads are fine: the first to enter saves numpy's setting, the last
    to leave restores it."""
    global _depth, _saved
    if _set_hint is None:
        yield
        return
    with _lock:
        _depth += 1
        if _depth == 1:
            _saved = _set_hint(False)
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _set_hint(_saved)
