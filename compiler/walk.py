"""The tracer's walk in C: ``compiler/templates/walk.c``, built once with the
machine's C compiler through ``compiler.build`` (cached like the generated
modules) and loaded with ``compiler.load``.

The Python walk (``trace._Walk``) costs 1-4 µs per ``Value``; the C walk
reads the same fields (``_prev``, ``_op``, ``_arg``, ``_data``, ``label``)
in the same order for a tenth of that. It reads only graphs it can read
exactly as the Python walk does, and returns None for anything else (the
Python walk then runs, and raises its own errors). Without a C compiler,
or with ``$MICROGRAD_NATIVE_WALK=0``, there is no C walk and the Python
walk does everything.
"""
import os
import threading

# Computed Values below which the Python walk does the whole walk: the C
# walk's first build costs about a second, and a small graph is walked in
# Python in less time than loading the C walk takes.
NATIVE_MIN_OPS = 20_000
# Inputs and parameters from which the C walk checks that they are leaves.
NATIVE_MIN_LEAVES = 5_000

_lock = threading.Lock()
_module = None
_problem = None          # why there is no C walk (None: not tried yet, or there is one)
_tried = False


def native_enabled():
    """Whether the C walk may be used: ``$MICROGRAD_NATIVE_WALK`` is not 0/off/no/false."""
    return os.environ.get('MICROGRAD_NATIVE_WALK', '').strip().lower() not in ('0', 'off', 'no', 'false')


def native_walker():
    """The loaded C walk module (its function ``walk``), or None when it
    cannot be built or loaded here (``problem()`` says why). Built on first
    use in this process; later processes find it in the build cache."""
    global _module, _problem, _tried
    if not native_enabled():
        return None
    with _lock:
        if not _tried:
            _tried = True
            try:
                _module = _build_and_load()
            except Exception as e:        # no compiler, no headers, a broken $CC: walk in Python
                _module, _problem = None, f'{type(e).__name__}: {e}'
        return _module


def loaded_walker():
    """The C walk module if this process has loaded it already, else None
    (this builds and loads nothing): a graph of any size is then walked in
    C at once, without the Python walk's first ``NATIVE_MIN_OPS`` Values."""
    return _module if native_enabled() else None


def native_loops(n_ops):
    """The C module for the loops of ``compiler.ir``'s analyses over a
    program of ``n_ops`` ops: for programs as large as the C walk reads
    (it is loaded anyway then), and for any program once this process has
    loaded it; else None (their Python loops)."""
    return native_walker() if n_ops >= NATIVE_MIN_OPS else loaded_walker()


def problem():
    """Why the C walk is not used (None: it is, or it was not needed yet)."""
    if not native_enabled():
        return 'disabled by $MICROGRAD_NATIVE_WALK'
    return _problem


def _build_and_load():
    from compiler.build import DEFAULT_TIMEOUT, BuildRequest, build_extension, default_flags, find_compiler
    from compiler.load import load_module
    from compiler.templates import read_template
    toolchain = find_compiler(None)
    request = BuildRequest.of(read_template('walk.c'), toolchain, default_flags(toolchain),
                              timeout=DEFAULT_TIMEOUT)
    build = build_extension(request)
    try:
        return load_module(build.path, sha256=build.sha256)
    finally:
        if build.temporary:
            folder = os.path.dirname(build.path)
            for name in os.listdir(folder):
                os.remove(os.path.join(folder, name))
            os.rmdir(folder)
