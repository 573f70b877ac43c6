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
import dataclasses
import os
import time
import warnings

from compiler.build import (BuildError, CacheError, CompileError, CompilerNotFound, CompileTimeout,
                            HeadersNotFound, DEFAULT_TIMEOUT, build_extension, build_unit_ahead,
                            discard_entry, find_compiler, plan, program_hash)
from compiler.build.process import usable_cores
from compiler.codegen import Source, emit_module, kernels_unit
from compiler.ir import MatVec, Op, Program, Sum, inputs_used
from compiler.pages import heap_memory, small_pages
from compiler.load import load_module
from compiler.export import ExportError
from compiler.model import CompiledModel, load, resolve_threads
from compiler.optim import OPTIMIZERS, SGD, Adam, AdamW
from compiler.trace import TraceError, trace, trace_graph
from micrograd.engine import Value, gc_paused
from compiler.passes import run_passes

__all__ = ['compile', 'trace', 'emit_module', 'CompiledModel', 'Program', 'Op', 'Sum', 'MatVec',
           'SGD', 'Adam', 'AdamW', 'load', 'ExportError', 'BuildError', 'CacheError', 'CompileError', 'CompilerNotFound',
           'CompileTimeout', 'HeadersNotFound', 'TraceError', 'find_compiler']



def compile(loss, inputs=(), params=(), outputs=(), cc=None, flags=None, opt=None,
            native=False, vectorize=True, timeout=DEFAULT_TIMEOUT, include_dir=None,
            optimizer=None, input_grads=False, constants=(), threads=None, progress=None):
    """Trace the graph of ``loss`` once and build it into a ``CompiledModel``.

    ``inputs`` are the leaf Values fed by ``set_input`` (or the rows of
    ``train_batch``/``predict``), ``params`` the leaves trained by ``update``
    or ``optimizer``, ``outputs`` any Values to read after ``forward``. Every
    other leaf is a constant; leaves you created yourself that are constants
    belong in ``constants`` (else a warning says that they may be forgotten
    inputs or parameters; numbers an op wrapped never warn).

    ``optimizer`` (``compiler.SGD``, ``Adam`` or ``AdamW``) runs in C for
    ``m.step()`` and ``m.train_batch``; ``input_grads=True`` makes
    ``backward`` also produce d loss / d input (``m.input_grads()``);
    ``threads`` caps the threads of ``train_batch`` and ``predict`` (default:
    ``$MICROGRAD_THREADS``, else the cores this process may use).
    ``progress(message)`` hears about builds expected to take more than a
    couple of seconds (a few lines, for a command line to print).
    ``vectorize`` runs the vectorizing pass (exact: results are bit for bit
    those of the straight-line program). ``cc`` picks the C compiler
    (``'tcc'``, ``'clang'``, ``'gcc'`` or a path; default ``$CC``, else
    chosen by the program's size: clang -O2 for small programs, -O1 for
    larger ones, then -O1 with the straight-line parts at -O0 or built by
    tcc, then tcc alone, see
    ``compiler.build.choose_build``); ``flags`` replaces the default flags
    entirely; otherwise ``opt`` sets the optimisation level of every part
    (default: by size) and ``native=True`` adds ``-march=native``. ``include_dir`` is
    the folder of ``Python.h`` (default: ``$MICROGRAD_PYTHON_INCLUDE``, else
    this interpreter's).
    """
    inputs, params, outputs, constants = _lists(inputs, params, outputs, constants)
    if optimizer is not None and not isinstance(optimizer, OPTIMIZERS):
        raise TypeError(f"optimizer must be compiler.SGD, Adam or AdamW, not {type(optimizer).__name__}")
    threads = resolve_threads(threads)
    timings = {}
    ahead = []

    def kernels_ahead():        # once: when the trace finds the graph large, or after it
        if vectorize and not ahead:
            ahead.append(_kernels_ahead(cc=cc, opt=opt, flags=flags, native=native, timeout=timeout,
                                        include_dir=include_dir))
    with gc_paused(), small_pages(), heap_memory():
        t0 = time.perf_counter()
        program, _, undeclared = trace_graph(loss, inputs, params, outputs, constants, input_grads,
                                             on_large=kernels_ahead)
        _refuse_silent_mistakes(program, params, undeclared, inputs)
        t1 = time.perf_counter()
        timings['trace'] = t1 - t0
        if vectorize:
            if program.n_ops >= AHEAD_MIN_OPS:
                kernels_ahead()
            program = run_passes(program)
        timings['passes'] = time.perf_counter() - t1
        t1 = time.perf_counter()
        source = emit_module(program, optimizer=optimizer)
        t2 = time.perf_counter()
        timings['codegen'] = t2 - t1
    request = plan(source, cc=cc, opt=opt, flags=flags, native=native, timeout=timeout,
                   include_dir=include_dir, progress=progress)
    build = build_extension(request)
    t3 = time.perf_counter()
    timings['compile'] = t3 - t2
    module, build = _load_built(request, build)
    timings['load'] = time.perf_counter() - t3
    model = CompiledModel(module, program, build, timings, source, optimizer=optimizer, params=params,
                          input_labels=[v.label for v in inputs], param_labels=[v.label for v in params],
                          input_grads=input_grads)
    if params:
        model.set_params([p.data for p in params])
    model.threads = threads
    return model


# A graph this large likely has MatVec ops and takes the front end a tenth of
# a second or more: time enough for a second core to build their loops.
AHEAD_MIN_OPS = 20_000


def _kernels_ahead(**build):
    """Start building the loop kernels' unit (the same for every program with
    MatVec ops: it sees only the fixed numbers) on a second core while the
    trace (from when it finds the graph large: on a cold cache, while the C
    walk is built), passes and codegen run on this one, into the cache, where
    the build finds it. A guess: a small program's flags (the size-aware
    choice may take others for a large one, and a program may have no
    MatVecs; the object then waits in the cache for one that uses it).
    Compiled after the front end, this unit was the last to finish for
    MNIST's MLPs."""
    if usable_cores() < 2:
        return None
    try:
        name, text = kernels_unit()
        request = plan(Source('', [('module', ''), (name, text)]), **build)
    except (BuildError, OSError):
        return None            # the program's own build reports it
    return build_unit_ahead(request, name, text)


def _lists(inputs, params, outputs, constants):
    """The four lists (generators too), refusing a ``Module`` where a list of
    Values belongs."""
    out = []
    for name, value in (('inputs', inputs), ('params', params), ('outputs', outputs),
                        ('constants', constants)):
        if hasattr(value, 'parameters') and callable(value.parameters):
            raise TraceError(f"{name}= got a {type(value).__name__}, not a list of Values: "
                             f"pass {name}=model.parameters()")
        if isinstance(value, Value):
            raise TraceError(f"{name}= got a single Value: pass a list, {name}=[v]")
        out.append(list(value))
    return out


def _labels(values, limit=8):
    labels = [v.label or f'Value(data={v.data:g})' for v in values[:limit]]
    return ', '.join(labels) + (f' and {len(values) - limit} more' if len(values) > limit else '')


def _refuse_silent_mistakes(program, params, undeclared, inputs):
    """No silent mistakes: leaves the user made that are neither inputs,
    parameters nor declared constants, and inputs nothing depends on."""
    if undeclared and not params:
        raise TraceError(f"params is empty, but the loss depends on {len(undeclared)} leaf Values you "
                         f"created that are neither inputs nor constants ({_labels(undeclared)}): they "
                         f"would never be trained. Pass params=model.parameters() (or list them in "
                         f"constants=[...] if they are meant to stay fixed)")
    if undeclared:
        warnings.warn(f"{len(undeclared)} leaf Values you created are neither inputs, params nor "
                      f"constants=[...] ({_labels(undeclared)}); they are compiled as constants with "
                      f"their current values", UserWarning, stacklevel=3)
    used = set(inputs_used(program))
    unused = [inputs[i] for i in range(program.n_inputs) if i not in used]
    if unused:
        warnings.warn(f"{len(unused)} inputs affect neither the loss nor the outputs "
                      f"({_labels(unused)})", UserWarning, stacklevel=3)


def _load_built(request, build):
    """The module of ``build`` and the ``Build`` it came from. The module must
    be the program just compiled: a cache entry replaced by another graph's
    object (and its checksum) is discarded and built once more."""
    for attempt in (1, 2):
        try:
            module = load_module(build.path, sha256=build.sha256)
            got, expected = getattr(module, 'program_hash', None), program_hash(request.source)
            problem = None if got == expected else (f"it reports program_hash {got}, but the "
                                                    f"program compiled has {expected}")
        except (ImportError, OSError) as e:
            problem = f"it does not load ({e})"
        finally:
            if build.temporary:
                _remove_build_dir(build.path)
        if problem is None:
            return module, (dataclasses.replace(build, path=None) if build.temporary else build)
        if not build.cached or attempt == 2:
            raise BuildError(f"the shared object {build.path} cannot be used: {problem}",
                             cmd=build.cmd)
        discard_entry(build.path)
        build = build_extension(dataclasses.replace(request, progress=None))


def _remove_build_dir(so_path):
    folder = os.path.dirname(so_path)
    for name in os.listdir(folder):
        os.remove(os.path.join(folder, name))
    os.rmdir(folder)
