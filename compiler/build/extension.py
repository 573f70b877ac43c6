"""``build_extension``: a ``BuildRequest`` into a shared object, in the
cache or in a temporary folder.

A source of several translation units is built part by part, the parts in
parallel, each part's object cached on its own (the loop kernels' part is
the same for every program), then linked. A shared object and each object
file go through the same steps (``_cached``): lock the entry, check again
whether someone else built it meanwhile, build to a temporary name, check
it, record its checksum, rename it into place. A failed build leaves no
shared object and no checksum, only its source.
"""
import concurrent.futures
import os
import shutil
import tempfile
import threading

from compiler.build.cache import (cache_chosen, cache_dir, cache_disabled, cache_max, cache_problem,
                                  describe, entry_lock, evict, is_out_of_space, record, sweep_temporaries,
                                  touch, trusted, warn_fallback)
from compiler.build.errors import CacheError
from compiler.build.process import kill_commands_of, usable_cores
from compiler.build.request import ANNOUNCE_AFTER, BuildRequest
from compiler.build.run import run_compiler
from compiler.build.verify import program_hash
from compiler.files import remove_if_present, write_atomically


def build_extension(request, toolchain=None, flags=None, **options):
    """Build ``request`` (a ``BuildRequest``) into a shared object, or reuse
    the cached one; a ``Build``. ``build_extension(source, toolchain, flags,
    timeout=..., ...)`` is ``build_extension(BuildRequest.of(source,
    toolchain, flags, ...))``.

    On failure the C source is kept (its path is in the exception) and no
    shared object is left behind.
    """
    if not isinstance(request, BuildRequest):
        request = BuildRequest.of(request, toolchain, flags, **options)
    elif toolchain is not None or flags is not None or options:
        raise TypeError("build_extension(request) takes no other arguments: they are in the request")
    if request.progress and request.estimate > ANNOUNCE_AFTER:
        source = request.source
        request.progress(f"compiling {getattr(source, 'statements', 0):,} statements in "
                         f"{max(1, len(request.parts))} parts with {request.toolchain.family} "
                         f"{' '.join(request.flags[:1])}: about {request.estimate:.0f} s")
    cap = None if cache_disabled() else cache_max()    # a bad $MICROGRAD_CACHE_MAX is an error
    try:
        root = cache_dir()
        if root is not None:
            return _build_in_cache(request, root, cap)
    except CacheError as e:
        if cache_chosen():
            raise
        warn_fallback(e.reason)                   # the default cache is unusable
    return _build_in_temporary_folder(request)


def build_unit_ahead(request, name, text):
    """Start building the translation unit ``name`` (C ``text``) of
    ``request`` into the cache in a background thread, for a build to come
    that has that unit: it then finds the object (or waits for it on the
    entry's lock) instead of compiling it after its program's front end. The
    thread, or None when there is no usable cache (nothing built ahead may be
    lost). The build itself says nothing: a failure is the later build's to
    report, with its context."""
    try:
        root = None if cache_disabled() else cache_dir()
    except CacheError:
        return None
    if root is None:
        return None

    def build():
        try:
            _object(request, name, text, root, cached=True)
        except Exception:
            pass
    thread = threading.Thread(target=build, name=f'micrograd-{name}-ahead', daemon=True)
    thread.start()
    return thread


def _cached(root, key, suffix, text, make):
    """The entry ``KEY.suffix`` of the cache folder ``root``: reused when it is
    trusted, else built under its lock by ``make(source_path, out_path)``
    (which checks what it built) from the source ``text``, recorded and
    renamed into place. Returns (path, checksum, what ``make`` returned:
    None when the entry was reused)."""
    out, digest = os.path.join(root, key + suffix), os.path.join(root, key + '.sha256')
    checksum = trusted(out, digest)
    if checksum:
        touch(out)
        return out, checksum, None
    with entry_lock(root, key):       # one process builds, the others wait and reuse
        checksum = trusted(out, digest)
        if checksum:
            touch(out)
            return out, checksum, None
        src = os.path.join(root, key + '.c')
        write_atomically(src, text)
        tmp = os.path.join(root, f'.tmp-{key}-{os.getpid()}-{threading.get_ident()}{suffix}')
        try:
            made = make(src, tmp)
            checksum = record(tmp, digest)
            os.replace(tmp, out)
        finally:
            remove_if_present(tmp)
    return out, checksum, made


def _build_in_cache(request, root, cap):
    key, built = request.key(), []

    def link(src, tmp):
        built.append(key)
        sweep_temporaries(root, busy={key})
        objects = _objects(request, root, cached=True)
        return run_compiler(request, request.toolchain, request.link_flags(), src, tmp, objects=objects,
                            expected_hash=program_hash(request.source))
    try:
        try:
            so, checksum, cmd = _cached(root, key, '.so', request.source, link)
        finally:
            if built and cap is not None:
                evict(root, cap, keep={key})
    except OSError as e:
        full = is_out_of_space(e)
        raise cache_problem(root, f"{'the disk is full' if full else describe(e)} "
                            f"({e.filename or root})", full) from e
    return request.built(so, cmd, cached=cmd is None, temporary=False, sha256=checksum)


def _build_in_temporary_folder(request):
    folder = None
    try:
        folder = tempfile.mkdtemp(prefix='micrograd-build-')
        src = os.path.join(folder, 'nn.c')
        with open(src, 'w') as f:
            f.write(request.source)
    except OSError as e:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        reason = f"no temporary build folder can be made in {tempfile.gettempdir()}: {describe(e)}"
        raise CacheError(f"{reason}; set TMPDIR to a writable folder, or MICROGRAD_CACHE_DIR to a "
                         "build cache folder", reason) from None
    so = os.path.join(folder, 'nn.so')
    objects = _objects(request, folder, cached=False)
    cmd = run_compiler(request, request.toolchain, request.link_flags(), src, so, objects=objects,
                       expected_hash=program_hash(request.source))
    return request.built(so, cmd, cached=False, temporary=True)


def _objects(request, folder, *, cached):
    """The object files of the request's translation units, compiled in
    parallel into ``folder`` (None for a source of one unit). ``cached``:
    each is kept as ``KEY.o`` under a key of its own, and reused."""
    parts = request.parts
    if not parts:
        return None
    progress = request.progress if request.estimate > ANNOUNCE_AFTER else None
    workers, stopping = set(), threading.Event()

    def unit(name, text):
        if stopping.is_set():
            raise concurrent.futures.CancelledError()
        workers.add(threading.get_ident())
        return _object(request, name, text, folder, cached=cached)
    with concurrent.futures.ThreadPoolExecutor(max(1, min(len(parts), usable_cores()))) as pool:
        futures = [pool.submit(unit, name, text) for name, text in parts]
        try:
            told = 0
            for done, _ in enumerate(concurrent.futures.as_completed(futures), 1):
                if progress and done * 4 // len(futures) > told:     # at each quarter
                    told = done * 4 // len(futures)
                    progress(f"compiled {done} of {len(futures)} parts")
            return [f.result() for f in futures]
        except BaseException:
            # Ctrl-C, SIGTERM or a failed unit: the other units' compilers
            # are stopped now, not waited for (a big build's would run on for
            # seconds after a Ctrl-C)
            stopping.set()
            for f in futures:
                f.cancel()
            kill_commands_of(workers)
            raise


def _object(request, name, text, folder, *, cached):
    """One translation unit's object file (reused from the cache when it is there and whole)."""
    toolchain, flags = request.unit(name)

    def compile_unit(src, out):
        return run_compiler(request, toolchain, flags, src, out, objects=())

    if cached:
        return _cached(folder, request.unit_key(name, text), '.o', text, compile_unit)[0]
    src = os.path.join(folder, f'{name}.c')
    with open(src, 'w') as f:
        f.write(text)
    obj = os.path.join(folder, f'{name}.o')
    compile_unit(src, obj)
    return obj
