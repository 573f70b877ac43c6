"""Compile a micrograd ``Value`` graph to a C extension module.

    import compiler
    m = compiler.compile(loss, inputs=xs, params=model.parameters(), outputs=logits)
    m.set_input(x); m.forward(); m.backward(); m.update(0.1)

Stages, in the one direction data flows: ``trace`` (``Value`` graph ->
``Program``, the IR of ``ir``), ``vectorize`` (a pass, ``Program ->
Program``), ``codegen`` (``Program`` -> C), ``build`` (C -> shared object,
cached), ``load`` (shared object -> module). Each stage imports only the
stages before it.
"""
import contextlib
import gc
import os
import time

from compiler.build import (BuildError, CompileError, CompilerNotFound, CompileTimeout,
                            HeadersNotFound, DEFAULT_TIMEOUT, build_extension,
                            default_flags, find_compiler)
from compiler.codegen import emit_module
from compiler.ir import MatVec, Op, Program, Sum
from compiler.load import load_module
from compiler.model import CompiledModel
from compiler.trace import TraceError, trace
from compiler.vectorize import vectorize as _vectorize   # the pass; `vectorize` is compile's switch

__all__ = ['compile', 'trace', 'emit_module', 'CompiledModel', 'Program',
           'Op', 'Sum', 'MatVec', 'BuildError', 'CompileError', 'CompilerNotFound',
           'CompileTimeout', 'HeadersNotFound', 'TraceError', 'find_compiler']


def compile(loss, inputs=(), params=(), outputs=(), cc=None, flags=None, opt=None,
            native=False, vectorize=True, timeout=DEFAULT_TIMEOUT, include_dir=None):
    """Trace the graph of ``loss`` once and build it into a ``CompiledModel``.

    ``inputs`` are the leaf Values fed by ``set_input`` (or the rows of
    ``train_batch``/``predict``), ``params`` the leaves trained by ``update``,
    ``outputs`` any Values to read after ``forward``. Every other leaf is a
    constant. ``vectorize`` runs the vectorizing pass (exact: results are
    bit for bit those of the straight-line program). ``cc`` picks the C compiler (``'tcc'``, ``'clang'``, ``'gcc'`` or a
    path; default ``$CC`` or the best installed); ``flags`` replaces the
    default flags entirely; otherwise ``opt`` sets the optimisation level
    (default: the fastest for that compiler) and ``native=True`` adds
    ``-march=native``. ``include_dir`` is the folder of ``Python.h`` (default:
    ``$MICROGRAD_PYTHON_INCLUDE``, else this interpreter's).
    """
    inputs, params, outputs = list(inputs), list(params), list(outputs)   # generators too
    timings = {}
    with _cyclic_gc_paused():
        t0 = time.perf_counter()
        program = trace(loss, inputs, params, outputs)
        t1 = time.perf_counter()
        timings['trace'] = t1 - t0
        if vectorize:
            program = _vectorize(program)
        timings['passes'] = time.perf_counter() - t1
        t1 = time.perf_counter()
        source = emit_module(program)
        t2 = time.perf_counter()
        timings['codegen'] = t2 - t1
    toolchain = find_compiler(cc)
    flags = list(flags) if flags is not None else default_flags(toolchain, opt, native)
    build = build_extension(source, toolchain, flags, timeout, include_dir)
    t3 = time.perf_counter()
    timings['compile'] = t3 - t2
    try:
        module = load_module(build.path)
    finally:
        if build.temporary:
            _remove_build_dir(build.path)
    timings['load'] = time.perf_counter() - t3
    model = CompiledModel(module, program, build, timings)
    model.source = source
    if params:
        model.set_params([p.data for p in params])
    return model


@contextlib.contextmanager
def _cyclic_gc_paused():
    """The stages allocate one object per op and make no reference cycles, yet
    each allocation burst makes the cyclic collector walk the whole graph
    again (a third of the MNIST graph's trace time). Reference counting
    still frees everything."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _remove_build_dir(so_path):
    folder = os.path.dirname(so_path)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    os.rmdir(folder)
