"""Rendering: a ``Program`` becomes the C source of the generated ``nn``
extension module.

Every line of C comes from this package: ``scalar.py`` (the op table),
``sums.py`` and ``matvec.py`` (one file per kind of vector op), ``layout.py``
(where each slot lives), ``optimizer.py`` (the optimizer's constants), and
``module.py`` (the module's assembly: a generated prologue of ``#define``
lines, the fixed C of ``compiler/templates/`` and the program). Only numbers
this package formats itself and integer slot indices reach the C text: op names select rows of the op table,
they are never copied.

The program runs over blocks of rows (compiler/codegen/layout.py): its
straight-line scalar code becomes per-row functions (*segments*, split at the
vector ops), and the emitted ``forward_rows``, ``backward_rows`` and
``param_grads`` run the segments and the vector ops' loops over a range of
rows, then add the parameter gradients up over the rows in row order.
"""
from compiler.codegen.module import GENERATOR_VERSION, Source, emit_header, emit_module, kernels_unit
from compiler.codegen.program import _Functions, _Program   # noqa: F401 (_Functions: for tests)
from compiler.codegen.scalar import c_double

__all__ = ['emit_module', 'emit_header', 'kernels_unit', 'Source', 'c_double', 'GENERATOR_VERSION']
