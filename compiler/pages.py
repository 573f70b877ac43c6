"""The front end's arrays on ordinary pages, not transparent huge pages.

numpy asks the kernel for huge pages (``madvise(MADV_HUGEPAGE)``) for every
array of 4 MB or more. The front end makes and drops many arrays of one
entry per op (52 MB each at microgpt 64/4/4), each fresh memory; where
transparent huge pages are ``madvise`` (Debian's and Ubuntu's default),
faulting in a huge page can mean compacting memory first, and in a process
that holds millions of ``Value``s that took most of the time. On the Intel
Xeon VM (model 167, KVM): one such array's first fill 0.19 s with the hint,
0.05 s without; 64/4/4's trace, passes and codegen 6.98-7.81 s with it,
6.50-6.63 s without (kernel time 2.6-3.1 -> 2.0 s). ``small_pages()`` turns
the hint off while the front end runs and puts numpy's setting back after;
the arrays the compiled model keeps are unaffected.
"""
import contextlib
import threading

import numpy as np

try:
    _set_hint = np._core.multiarray._set_madvise_hugepage       # numpy 2
except AttributeError:                                           # numpy 1, or a build without it
    _set_hint = getattr(getattr(getattr(np, 'core', None), 'multiarray', None), '_set_madvise_hugepage', None)

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
