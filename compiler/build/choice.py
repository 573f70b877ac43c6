"""The size-aware choice of a build, and ``plan``: what ``compiler.compile``
asks the build for.

Without a compiler or level given, the build is chosen by the program's
size: the fastest code whose compile fits in ``COMPILE_BUDGET`` seconds
(``DEFAULT_BUILDS``, ``choose_build``).
"""
import os
from dataclasses import dataclass

from compiler.build.errors import CompilerNotFound
from compiler.build.flags import DEFAULT_TIMEOUT, check_flags, check_opt, default_flags
from compiler.build.process import usable_cores
from compiler.build.request import BuildRequest
from compiler.build.toolchain import Toolchain, find_compiler

# Seconds one core spends per straight-line statement of generated code, by
# compiler and level (measured on microgpt's and MNIST's programs: clang 14,
# gcc 12, tcc 0.9.27, 2-core AMD EPYC). clang and gcc are far slower per
# statement than tcc, and more so the more they optimise.
COMPILE_SECONDS = {('clang', '-O2'): 3.4e-4, ('clang', '-O1'): 2.4e-4, ('clang', '-O0'): 7e-5,
                   ('gcc', '-O3'): 4.0e-4, ('gcc', '-O1'): 3.4e-4, ('gcc', '-O0'): 1.2e-4,
                   ('tcc', None): 3e-6}
# What a build with default arguments may spend compiling straight-line code.
COMPILE_BUDGET = 4.0
# Straight-line statements per line of the module's part that calls them
# (a declaration and a call per function of about 100 statements).
STATEMENTS_PER_CALL = 50
# Default builds, fastest code first: (compiler, level, level of the
# straight-line parts; None: the same; 'tcc': built by tcc). The loop kernels
# and the module's own code are a fixed couple of thousand lines, always worth
# optimising; straight-line code gains less from -O1 than it costs. microgpt,
# 42k statements: compile 5.6 s and 0.074 ms a step at -O1; 2.5 s and 0.069 ms
# with the straight-line parts at -O0; 1.9 s and 0.08-0.10 ms with them built
# by tcc (whose objects link into clang's or gcc's module).
DEFAULT_BUILDS = (('clang', '-O2', None), ('gcc', '-O3', None), ('clang', '-O1', None), ('gcc', '-O1', None),
                  ('clang', '-O1', '-O0'), ('gcc', '-O1', '-O0'), ('clang', '-O1', 'tcc'), ('gcc', '-O1', 'tcc'),
                  ('tcc', None, None))


# The level of the loop kernels' unit when no level is asked for (choice.plan):
# each optimising compiler's first, fastest default build.
KERNELS_LEVEL = {family: level for family, level, _ in reversed(DEFAULT_BUILDS) if level is not None}


def compile_estimate(family, opt, statements, parts=1):
    """Seconds a build of ``statements`` straight-line statements in
    ``parts`` translation units may take (the parts build in parallel);
    ``opt='tcc'``: those parts built by tcc."""
    if opt == 'tcc':
        family, opt = 'tcc', None
    cost = COMPILE_SECONDS.get((family, opt if family != 'tcc' else None), 3.4e-4)
    return statements * cost / max(1, min(parts, usable_cores()))


def build_estimate(family, level, straight, statements, parts=1):
    """``compile_estimate`` of a build at ``level`` whose straight-line parts
    are at ``straight`` (None: the same level; ``'tcc'``: built by tcc)."""
    seconds = compile_estimate(family, straight or level, statements, parts)
    if straight:    # the module's part declares and calls the straight-line functions, at `level`
        seconds += compile_estimate(family, level, statements / STATEMENTS_PER_CALL)
    return seconds


@dataclass(frozen=True)
class Choice:
    """What ``choose_build`` chose: the compiler, its level (None: the
    compiler's default), and the level of the straight-line parts (or
    ``'tcc'``, and ``straight_toolchain`` is tcc)."""
    toolchain: Toolchain
    opt: str = None
    straight_opt: str = None
    straight_toolchain: Toolchain = None

    def estimate(self, statements, parts):
        return build_estimate(self.toolchain.family, self.opt, self.straight_opt, statements, parts)


def choose_build(cc=None, opt=None, statements=0, parts=1):
    """A ``Choice``: what was asked for, else chosen by the program's size.
    The fastest code whose compile fits in ``COMPILE_BUDGET`` seconds (see
    ``DEFAULT_BUILDS``): clang -O2 or gcc -O3 for the programs the
    vectorizing pass makes small, -O1 for larger ones, then -O1 with the
    straight-line parts at -O0, then built by tcc (not when ``cc`` names the
    compiler), and tcc alone for straight-line programs of
    hundreds of thousands of statements, which the optimising compilers take
    minutes over and barely speed up. An ``opt`` given is used for every
    part."""
    def fits(family, level, straight):
        return build_estimate(family, level, straight, statements, parts) <= COMPILE_BUDGET

    if cc is not None or os.environ.get('CC', '').strip():
        toolchain = find_compiler(cc)
        if opt is not None or toolchain.family == 'tcc':
            return Choice(toolchain, opt)
        builds = [b for b in DEFAULT_BUILDS if b[0] == toolchain.family and b[2] != 'tcc']
        family, level, straight = next((b for b in builds if fits(*b)), builds[-1])
        return Choice(toolchain, level, straight)
    found = {}
    for family in ('clang', 'gcc', 'tcc'):
        try:
            found[family] = find_compiler(family)
        except CompilerNotFound:
            pass
    if not found:
        return Choice(find_compiler(None), opt)        # cc, or a clear error
    builds = [b for b in DEFAULT_BUILDS if b[0] in found and (b[2] != 'tcc' or 'tcc' in found)]
    family, level, straight = next((b for b in builds if fits(*b)), builds[-1])
    if opt is not None:
        level, straight = opt, None
    return Choice(found[family], level, straight, found['tcc'] if straight == 'tcc' else None)


def plan(source, cc=None, opt=None, flags=None, native=False, timeout=DEFAULT_TIMEOUT, include_dir=None,
         progress=None):
    """The ``BuildRequest`` for ``source`` (a ``compiler.codegen.Source``, or
    a str: one unit) with ``compiler.compile``'s arguments: ``cc`` (a
    name, a path, a command or a ``Toolchain``; default ``$CC``, else chosen
    by size), ``flags`` (replace the defaults entirely; the straight-line
    parts then get them too), else ``opt`` (the level of every part; default
    by size) and ``native`` (adds ``-march=native``)."""
    check_opt(opt)          # 'O2' or '-Ofast' is refused even when flags= makes it unused
    statements = getattr(source, 'statements', 0)
    parts = max(1, len(getattr(source, 'parts', ())))
    if isinstance(cc, Toolchain):
        choice = Choice(cc, opt)
    else:
        choice = choose_build(cc, opt, statements, parts)
    toolchain, straight_flags, kernel_flags = choice.toolchain, None, None
    if flags is not None:
        flags = check_flags(flags)
    else:
        flags = default_flags(toolchain, choice.opt, native)
        if choice.straight_toolchain is not None:
            straight_flags = default_flags(choice.straight_toolchain)
        elif choice.straight_opt:
            straight_flags = default_flags(toolchain, choice.straight_opt, native)
        if opt is None and toolchain.family in KERNELS_LEVEL:
            # the loop kernels' unit is the same fixed text for every program: at
            # the family's best level always (its object is one cache entry, built
            # ahead while the front end runs), whatever the size chose for the rest
            kernel_flags = default_flags(toolchain, KERNELS_LEVEL[toolchain.family], native)
    # the scalar code's form was chosen with the C (compiler/codegen/table.py: an
    # op table above TABLE_MIN_OPS scalar ops); the build carries it to report it
    return BuildRequest.of(source, toolchain, flags, timeout=timeout, include_dir=include_dir,
                           progress=progress, straight_flags=straight_flags,
                           straight_toolchain=choice.straight_toolchain,
                           estimate=choice.estimate(statements, parts),
                           table_ops=getattr(source, 'table_ops', 0), kernel_flags=kernel_flags)
