"""Random call sequences with random arguments against one small compiled module.

A program, not a test: ``tests/test_module_arguments.py`` runs it in a
subprocess, so that a crash shows up as the signal that killed it.

    python -m tests.fuzz_module --calls 20000 --seed 1 --cc tcc

Every entry point of the ``nn`` module is called with good and bad arguments
(wrong types, lengths, dtypes, shapes, strides, read-only buffers, objects
whose ``__float__`` raises or mutates the list being read, released
memoryviews, wrong argument counts) in random order. Checked after every call:

- it returned the right type, or raised TypeError, ValueError or RuntimeError
  with a message naming the function, or passed on an exception the
  argument itself raised;
- a call that raised left the values and gradients as they were;
- the reference counts of the argument objects (and of a list's items) are
  the same as before the call: no leaked reference and no leaked buffer
  export (an export holds a reference to its exporter).

Over the whole run, the memory traced by ``tracemalloc`` and the number of
objects the garbage collector tracks must not grow between the first and the
second half. Prints one JSON line with the counts.
"""
import argparse
import gc
import json
import math
import random
import sys
import time
import tracemalloc
from array import array

import numpy as np


from tests.graphs import compile_small


class ArgError(Exception):
    """Raised by an argument's own method: must pass through unchanged."""


class RaisingFloat:
    def __float__(self):
        raise ArgError("__float__ raised")


class FloatSub(float):
    pass


class ShrinkingItem:
    """Empties the list it is in while being converted."""

    def __init__(self, owner):
        self.owner = owner

    def __float__(self):
        self.owner.clear()
        return 1.0


class LyingList(list):
    def __len__(self):
        return 3


def argument_pool(n_in, n_params, n_out, n_slots):
    """Good and bad candidates for each kind of argument. Objects are made once
    and reused, so that their reference counts can be compared across calls."""
    def vec(n, dtype='f8'):
        return np.arange(n, dtype=dtype) / 4 if np.dtype(dtype).kind != 'O' else np.array([0.5] * n, dtype=object)

    def mv(n):
        return memoryview(bytearray(8 * n)).cast('d')

    released = memoryview(bytearray(8 * n_in)).cast('d')
    released.release()
    readonly = np.zeros(max(n_params, n_in, n_out, n_slots))
    readonly.flags.writeable = False
    shrinking = [0.5] * n_in
    shrinking[-1] = ShrinkingItem(shrinking)
    big = np.zeros((4, 2 * max(n_in, n_out)))
    bad = [None, 'abc', b'\x00' * 8 * n_in, bytearray(8 * n_in), 3, -1.5, math.nan, math.inf,
           object(), [], [None] * n_in, ['x'] * n_in, {}, {1, 2}, 10 ** 400, RaisingFloat(),
           vec(n_in, 'f4'), vec(n_in, 'i8'), vec(n_in, 'O'), vec(n_in, 'c16'), vec(n_in, '>f8'),
           np.zeros(n_in, dtype=bool), np.zeros(2 * n_in)[::2], np.zeros((1, n_in)),
           np.zeros((2, n_in, 1)), np.zeros(()), released, memoryview(bytes(8 * n_in)).cast('d'),
           readonly[:n_in], readonly[:n_params], readonly[:n_out], readonly[:n_slots],
           big[:, ::2], np.asfortranarray(np.zeros((3, n_in))), np.zeros((3, n_in + 1)),
           np.zeros((3, n_out + 1)), np.zeros((0, n_in)), vec(n_in + 1), vec(max(n_in - 1, 0)),
           LyingList([0.5]), shrinking, [RaisingFloat()] * n_in, (0.5,) * (n_in + 2),
           np.array([0.5, math.nan] * n_params)[:n_params], np.full(n_params, -math.inf), -0.1]
    good = {
        'values': [vec(n_in), list(vec(n_in)), tuple(vec(n_in)), array('d', vec(n_in)), mv(n_in),
                   [FloatSub(0.25)] * n_in, [1] * n_in, [math.nan] * n_in, vec(n_in, '<f8')],
        'params': [vec(n_params), array('d', vec(n_params)), mv(n_params), vec(n_params) * -3,
                   readonly[:n_params]],
        'out_params': [np.zeros(n_params), mv(n_params), array('d', [0.0] * n_params)],
        'out_outputs': [np.zeros(n_out), mv(n_out)],
        'out_data': [np.zeros(n_slots), mv(n_slots)],
        'lr': [0.0, 0.01, 0.1, np.float64(0.05), 1, FloatSub(0.2), -0.0],
        'X': [np.random.default_rng(r).standard_normal((r, n_in)) for r in (1, 3, 17)]
             + [memoryview(bytearray(8 * n_in * 2)).cast('d', (2, n_in)), np.zeros((0, n_in))],
        'pred_out': [np.zeros((r, n_out)) for r in (0, 1, 2, 3, 17)],
    }
    return good, bad, shrinking


SIGNATURES = {
    'set_input': ['values'], 'forward': [], 'backward': [], 'zero_grad': [], 'update': ['lr'],
    'step': ['lr'],
    'read_params': ['out_params'], 'read_grads': ['out_params'], 'write_params': ['params'],
    'read_data': ['out_data'], 'read_outputs': ['out_outputs'], 'train_batch': ['X', 'lr'],
    'predict': ['X', 'pred_out'],
}
RETURNS = {'forward': float, 'train_batch': float}


def watched(args):
    """The objects whose reference counts a call must not change."""
    objs = []
    for a in args:
        if type(a) is list and any(isinstance(x, ShrinkingItem) for x in a):
            continue   # it lets go of its item, and the item of it, during the call: not a leak
        objs.append(a)
        if type(a) in (list, tuple, LyingList):
            objs.extend(a)
    # small ints and None are shared with the rest of the interpreter
    return [o for o in objs if type(o) not in (int, bool, type(None))]


def fuzz(module, calls, seed):
    rng = random.Random(seed)
    n_in, n_params, n_out, n_slots = module.n_inputs, module.n_params, module.n_outputs, module.n_data
    good, bad, shrinking = argument_pool(n_in, n_params, n_out, n_slots)
    data_before, data_after = np.empty(n_slots), np.empty(n_slots)
    grad_before, grad_after = np.empty(n_params), np.empty(n_params)
    names = list(SIGNATURES)
    errors = {}
    half = {}
    forward_done = False
    succeeded = 0
    t0 = time.perf_counter()
    for i in range(calls):
        if i == calls // 2:
            gc.collect()
            half = {'traced': tracemalloc.get_traced_memory()[0], 'gc_objects': len(gc.get_objects())}
        name = rng.choice(names)
        kinds = SIGNATURES[name]
        if rng.random() < 0.05:     # a wrong number of arguments
            kinds = kinds + ['lr'] if rng.random() < 0.5 or not kinds else kinds[:-1]
        args = [rng.choice(good[k]) if rng.random() < 0.7 else rng.choice(bad) for k in kinds]
        if name == 'predict' and len(args) == 2 and rng.random() < 0.6 and any(args[0] is x for x in good['X']):
            rows = args[0].shape[0]     # mostly an out that fits, to get past the checks
            args[1] = next((o for o in good['pred_out'] if o.shape[0] == rows), args[1])
        objs = watched(args)
        counts = [sys.getrefcount(o) for o in objs]
        module.read_data(data_before)
        module.read_grads(grad_before)
        # all arguments good, and as many as needed: the call must succeed,
        # unless the module's state forbids it
        all_good = len(kinds) == len(SIGNATURES[name]) and all(
            any(a is g for g in good[k]) for a, k in zip(args, kinds))
        rows = len(args[0]) if name in ('train_batch', 'predict') and all_good else None
        must_fail = all_good and ((name == 'backward' and not forward_done)
                                  or (name == 'train_batch' and rows == 0)
                                  or (name == 'predict' and len(args[1]) != rows))
        result = None
        try:
            result = getattr(module, name)(*args)
        except (TypeError, ValueError, RuntimeError) as e:
            msg = str(e)
            own = (f'{name}()' in msg
                   or 'memoryview' in msg or 'ArgError' in type(e).__name__)
            if not own:
                raise AssertionError(f"call {i}: {name}{tuple(map(type, args))} raised an unclear "
                                     f"{type(e).__name__}: {msg}") from None
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            if all_good and not must_fail:
                raise AssertionError(f"call {i}: {name}{tuple(type(a).__name__ for a in args)} "
                                     f"with good arguments raised {type(e).__name__}: {msg}") from None
            module.read_data(data_after)
            module.read_grads(grad_after)
            if not (_same(data_before, data_after) and _same(grad_before, grad_after)):
                raise AssertionError(f"call {i}: {name} raised {type(e).__name__} ({msg}) "
                                     "but changed the module's state") from None
        except ArgError:
            errors['ArgError'] = errors.get('ArgError', 0) + 1
        else:
            expected = RETURNS.get(name, type(None))
            if type(result) is not expected:
                raise AssertionError(f"call {i}: {name} returned {result!r}, expected a {expected.__name__}")
            if must_fail:
                raise AssertionError(f"call {i}: {name}{tuple(type(a).__name__ for a in args)} "
                                     f"succeeded where it must fail (forward_done={forward_done})")
            if name == 'forward':       # predict runs rows of its own
                forward_done = True
            elif name in ('set_input', 'update', 'step', 'write_params', 'train_batch'):
                forward_done = False
            succeeded += 1
        result = None
        after = [sys.getrefcount(o) for o in objs]
        if after != counts:
            leaks = [(type(o).__name__, b, a) for o, b, a in zip(objs, counts, after) if a != b]
            raise AssertionError(f"call {i}: {name}{tuple(type(a).__name__ for a in args)} "
                                 f"changed reference counts (type, before, after): {leaks}")
        if not shrinking:       # emptied by its ShrinkingItem: fill it again
            shrinking[:] = [0.5] * (n_in - 1) + [ShrinkingItem(shrinking)]
    seconds = time.perf_counter() - t0
    gc.collect()
    end = {'traced': tracemalloc.get_traced_memory()[0], 'gc_objects': len(gc.get_objects())}
    return {'calls': calls, 'seconds': round(seconds, 3), 'succeeded': succeeded, 'errors': errors,
            'traced_growth': end['traced'] - half['traced'],
            'gc_objects_growth': end['gc_objects'] - half['gc_objects']}


def _same(a, b):
    return np.array_equal(a, b, equal_nan=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--calls', type=int, default=20000)
    ap.add_argument('--seed', type=int, default=1)
    ap.add_argument('--cc', default=None)
    ap.add_argument('--no-tracemalloc', action='store_true')
    args = ap.parse_args()
    model = compile_small(args.cc)
    if not args.no_tracemalloc:
        tracemalloc.start()
    report = fuzz(model.module, args.calls, args.seed)
    report['cc'] = model.build.toolchain.family
    print(json.dumps(report))


if __name__ == '__main__':
    main()
