"""One differential helper: run the interpreter and the compiled module on the
same graph and samples, compare every value bit for bit, and name the first
mismatch with its op."""
import math
import shutil
import struct
import warnings

import numpy as np
import pytest

import compiler
from compiler.build import default_flags, find_compiler
from compiler.codegen.layout import Layout
from compiler.ir import needs_grad
from compiler.trace import trace_with_slots
from micrograd import Value

COMPILERS = [cc for cc in ('tcc', 'clang', 'gcc') if shutil.which(cc)]
# the quickest to build with, for tests about something other than a compiler
FAST_CC = 'tcc' if 'tcc' in COMPILERS else (COMPILERS[0] if COMPILERS else None)
needs_cc = pytest.mark.skipif(not COMPILERS, reason="no C compiler installed")


def split_flags(cc):
    """``cc``'s default flags, built so that every thread asked for does a
    share of even one row (by default a small job runs on fewer threads)."""
    return default_flags(find_compiler(cc)) + ['-DMICROGRAD_MIN_WORK_PER_THREAD=0']


def same(a, b):
    """Equal as IEEE doubles: the same bits, except that any NaN equals any NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return struct.pack('<d', a) == struct.pack('<d', b)


def interpret(build, input_values, param_values):
    """Build the graph afresh from leaf values and run the interpreter on it."""
    inputs = [Value(x) for x in input_values]
    params = [Value(p) for p in param_values]
    loss, outputs = build(inputs, params)
    loss.backward()
    return inputs, params, loss, outputs


def compile_graph(build, n_inputs, param_values, cc, **kwargs):
    inputs, params, loss, outputs = interpret(build, [0.0] * n_inputs, param_values)
    with warnings.catch_warnings():
        # random graphs leave inputs unused and make constants of their own
        warnings.simplefilter('ignore', UserWarning)
        return compiler.compile(loss, inputs=inputs, params=params, outputs=outputs, cc=cc, **kwargs)


def assert_matches_interpreter(build, samples, param_values, cc, model=None, **kwargs):
    """Compile ``build`` once, then check forward, outputs and parameter
    gradients for every sample of inputs against a fresh interpreter run.

    ``build(inputs, params) -> (loss, outputs)`` builds the graph from leaves.
    Returns the compiled model so callers can check more.
    """
    model = model or compile_graph(build, len(samples[0]), param_values, cc, **kwargs)
    for n, sample in enumerate(samples):
        inputs, params, loss, outputs = interpret(build, sample, param_values)
        model.zero_grad()
        model.set_input(list(sample))
        got = model.forward()
        where = f"[{cc}, sample {n}]"
        if not same(got, loss.data):
            raise AssertionError(f"{where} loss {got!r} != interpreter {loss.data!r}\n"
                                 + first_mismatch(model, loss, inputs, params, outputs))
        for i, (g, v) in enumerate(zip(model.outputs(), outputs)):
            assert same(g, v.data), f"{where} outputs[{i}] {g!r} != interpreter {v.data!r}"
        model.backward()
        for i, (g, p) in enumerate(zip(model.grads(), params)):
            assert same(g, p.grad), f"{where} grad of params[{i}] {g!r} != interpreter {p.grad!r}"
        if kwargs.get('input_grads'):
            for i, (g, x) in enumerate(zip(model.input_grads(), inputs)):
                assert same(g, x.grad), f"{where} grad of inputs[{i}] {g!r} != interpreter {x.grad!r}"
    return model


def first_mismatch(model, loss, inputs, params, outputs):
    """The first slot, in program order, whose compiled value differs."""
    program, slots = trace_with_slots(loss, inputs, params, outputs)
    data = np.empty(model.module.n_data)
    model.module.read_data(data)      # set_input's row, then the parameters and constants
    layout = Layout(model.program, needs_grad(model.program))

    def compiled(s):
        return data[layout.row_index(s)] if layout.is_row(s) else data[layout.n_row + layout.shared_index(s)]
    new_slot = model.program.slot_map or range(program.n_slots)   # renumbered by a pass?
    value_of = {s: v for v, s in slots.items()}
    for op in program.ops:
        v = value_of[op.out]
        if new_slot[op.out] is None:
            continue       # lifted into a loop: no slot of its own
        got = compiled(new_slot[op.out])
        if not same(got, v.data):
            operands = ', '.join(f'%{a}={value_of[a].data!r}' for a in op.args)
            return f"first mismatch: {op}  compiled {got!r}, interpreter {v.data!r}; operands {operands}"
    return "no slot differs (check the slot layout)"


def assert_train_batch_matches_interpreter(build, X, param_values, lr, cc, steps=1, **kwargs):
    """``train_batch(X, lr)`` ``steps`` times against the interpreter doing the
    same: every row's gradients accumulated into one set of parameters, row by
    row, then ``p -= lr * (grad / rows)``. The mean loss and every parameter
    must be the same bits. Returns the compiled model."""
    X = np.ascontiguousarray(X, dtype=np.float64)
    model = compile_graph(build, X.shape[1], param_values, cc, **kwargs)
    params = [Value(p) for p in param_values]
    for step in range(steps):
        got = model.train_batch(X, lr)
        for p in params:
            p.grad = 0.0
        total = 0.0
        for row in X.tolist():
            loss, _ = build([Value(x) for x in row], params)
            loss.backward()        # accumulates into the shared parameters
            total += loss.data
        for p in params:
            p.data -= lr * (p.grad / len(X))
        where = f"[{cc}, step {step}]"
        assert same(got, total / len(X)), f"{where} mean loss {got!r} != interpreter {total / len(X)!r}"
        for i, (g, p) in enumerate(zip(model.params(), params)):
            assert same(g, p.data), f"{where} params[{i}] {g!r} != interpreter {p.data!r}"
    return model
