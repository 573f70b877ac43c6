"""The size-aware default build: which compiler and levels ``compile()``
chooses for a program's size (the choice, never a time), and that a build
whose straight-line parts have a level of their own is still exact."""
import math
import os
import random
import shutil
import subprocess
import sysconfig

import pytest

from compiler.build import cache, choice as choosing
from compiler.build import COMPILE_BUDGET, COMPILE_SECONDS, BuildRequest, build_extension, choose_build, plan
from compiler import SGD, Adam, emit_module, trace
from compiler.passes import run_passes
from micrograd import Value
from micrograd.nn import MLP
from tests.differential import FAST_CC, assert_matches_interpreter
from tests.test_build import compile_tiny

HAVE = {cc: bool(shutil.which(cc)) for cc in ('clang', 'gcc', 'tcc')}
needs_clang = pytest.mark.skipif(not HAVE['clang'], reason="clang is not installed")


@pytest.fixture
def one_core(monkeypatch):
    """Estimates divide by the cores: fix them, so that the sizes below mean the same everywhere."""
    monkeypatch.setattr(choosing, 'usable_cores', lambda: 1)


def statements_for(family, level, share):
    """A program size whose estimate at (family, level) is ``share`` of the budget."""
    return int(COMPILE_BUDGET * share / COMPILE_SECONDS[family, level])


def choice(**kwargs):
    c = choose_build(**kwargs)
    return c.toolchain.family, c.opt, c.straight_opt


@needs_clang
def test_a_small_program_gets_the_fastest_code(one_core):
    assert choice(statements=100) == ('clang', '-O2', None)


@needs_clang
def test_larger_programs_step_down_one_level_at_a_time(one_core):
    assert choice(statements=statements_for('clang', '-O1', 0.9)) == ('clang', '-O1', None)
    # too big for -O1 everywhere: the loops at -O1, the straight-line code at -O0
    assert choice(statements=statements_for('clang', '-O1', 1.5)) == ('clang', '-O1', '-O0')
    assert choice(statements=statements_for('clang', '-O0', 0.5)) == ('clang', '-O1', '-O0')


@pytest.mark.skipif(not (HAVE['clang'] and HAVE['tcc']), reason="needs clang and tcc")
def test_then_tcc_builds_the_straight_line_parts_and_a_huge_program_goes_to_tcc(one_core):
    # too big for -O0: tcc builds the straight-line parts, clang the loops
    assert choice(statements=statements_for('clang', '-O0', 1.5)) == ('clang', '-O1', 'tcc')
    assert choose_build(statements=statements_for('clang', '-O0', 1.5)).straight_toolchain.family == 'tcc'
    # a million-op graph's backward alone is a million statements or more: even
    # the module's calls of them are too much for clang
    assert choice(statements=10_000_000) == ('tcc', None, None)


@needs_clang
def test_more_cores_fit_more(monkeypatch):
    size = statements_for('clang', '-O1', 1.5)
    monkeypatch.setattr(choosing, 'usable_cores', lambda: 1)
    assert choice(statements=size, parts=4) == ('clang', '-O1', '-O0')
    monkeypatch.setattr(choosing, 'usable_cores', lambda: 4)
    assert choice(statements=size, parts=4)[2] is None       # every part optimised


@needs_clang
def test_a_compiler_asked_for_keeps_its_family_and_an_opt_asked_for_is_used_everywhere(one_core):
    big = statements_for('clang', '-O1', 1.5)
    assert choice(cc='clang', statements=big) == ('clang', '-O1', '-O0')
    assert choice(cc='clang', statements=10**8) == ('clang', '-O1', '-O0')   # never tcc when clang is asked for
    assert choice(cc='clang', opt='-O2', statements=big) == ('clang', '-O2', None)
    assert choice(opt='-O3', statements=big)[1:] == ('-O3', None)


def chain_graph(n_inputs=8, n_ops=3000, seed=5):
    """A straight-line graph of scalar ops (no sums to lift): ``build(inputs, params)``."""
    rng = random.Random(seed)
    plan = [(rng.choice('+*t'), rng.randrange(10**6), rng.randrange(10**6)) for _ in range(n_ops)]

    def graph(inputs, params):
        nodes = list(inputs) + list(params)
        for op, i, j in plan:
            a, b = nodes[-1 - i % min(16, len(nodes))], nodes[j % len(nodes)]
            nodes.append(a + b if op == '+' else a * b * 0.5 if op == '*' else (a * 0.25).tanh())
        loss = nodes[-1]
        for node in nodes[-50:-1]:
            loss = loss + node
        return loss, nodes[-5:]
    return graph


@needs_clang
def test_straight_line_parts_at_their_own_level_are_exact_and_named(monkeypatch, tmp_path):
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(tmp_path))
    # a budget this program just misses at -O1: the straight-line parts go to -O0
    monkeypatch.setattr(choosing, 'COMPILE_BUDGET', 1e-9)
    monkeypatch.setattr(choosing, 'COMPILE_SECONDS', {**COMPILE_SECONDS, ('clang', '-O0'): 0.0})
    graph = chain_graph()
    samples = [[math.sin(k + i) for i in range(8)] for k in range(3)]
    m = assert_matches_interpreter(graph, samples, [0.3, -0.7], 'clang')
    assert m.build.flags[0] == '-O1' and m.build.straight_flags[0] == '-O0'
    # each part was compiled with its own flags: its cached object is under that key
    source, tc = m.source, m.build.toolchain
    assert source.straight and set(source.straight) < {name for name, _ in source.parts}
    for name, text in source.parts:
        flags = m.build.straight_flags if name in source.straight else m.build.flags
        assert (tmp_path / (cache.build_key(text, tc, ['-c', *flags]) + '.o')).exists(), name
    assert '(straight-line parts -O0)' in repr(m) and '(straight-line parts -O0)' in m.summary()
    # the same program with every part at -O1 is another cache entry, with the same results
    monkeypatch.setattr(choosing, 'COMPILE_BUDGET', 1e9)
    m1 = assert_matches_interpreter(graph, samples, [0.3, -0.7], 'clang')
    assert m1.build.path != m.build.path and m1.build.straight_flags is None
    assert m1.build.flags[0] == '-O2'


@needs_clang
def test_the_loop_kernels_unit_is_optimised_fully_whatever_level_the_size_chose(monkeypatch, tmp_path):
    """The loop kernels' unit is the same text for every program: at clang
    -O2 even where the program's size chose -O1 for the rest (its object is
    then the one the ahead build makes), unless a level is asked for."""
    from compiler.build.flags import default_flags
    from compiler.codegen import kernels_unit
    from compiler.codegen.module import Source
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(tmp_path))
    monkeypatch.setattr(choosing, 'COMPILE_BUDGET', 1e-9)     # -O1, the straight-line parts -O0
    monkeypatch.setattr(choosing, 'COMPILE_SECONDS', {**COMPILE_SECONDS, ('clang', '-O0'): 0.0})
    def graph(inputs, params):          # two layers (MatVecs: the kernels unit), a scalar tail
        weights = iter(params)

        def layer(xs, n, relu):
            acts = [sum((next(weights) * x for x in xs), next(weights)) for _ in range(n)]
            return [a.relu() for a in acts] if relu else acts
        nodes = layer(layer(inputs, 8, True), 3, False)
        outputs = list(nodes)
        for k in range(300):
            nodes.append((nodes[-1] * 0.5 + nodes[-1 - k % 3]).tanh())
        return sum(nodes[-5:]), outputs
    samples = [[math.cos(k + i) for i in range(12)] for k in range(3)]
    weights = [math.sin(3 * j) * 0.4 for j in range(8 * 13 + 3 * 9)]
    m = assert_matches_interpreter(graph, samples, weights, 'clang')
    tc, units = m.build.toolchain, dict(m.source.parts)
    assert 'kernels' in units and 'MatVec' in m.summary()
    assert m.build.flags[0] == '-O1' and m.build.kernel_flags == default_flags(tc, '-O2')
    assert '(loop kernels -O2)' in m.build.flags_text()
    for name, text in units.items():
        flags = (m.build.kernel_flags if name == 'kernels' else
                 m.build.straight_flags if name in m.source.straight else m.build.flags)
        assert (tmp_path / (cache.build_key(text, tc, ['-c', *flags]) + '.o')).exists(), name
    # the ahead build's request (no program yet: the fastest level) names the same object
    name, text = kernels_unit()
    ahead = plan(Source('', [('module', ''), (name, text)]), cc='clang')
    assert ahead.unit_key(name, text) == plan(m.source, cc='clang').unit_key(name, text)
    # a level asked for is every part's
    asked = plan(m.source, cc='clang', opt='-O1')
    assert asked.kernel_flags is None and asked.unit('kernels')[1][0] == '-O1'


@pytest.mark.skipif(not (HAVE['clang'] and HAVE['tcc']), reason="needs clang and tcc")
def test_straight_line_parts_built_by_tcc_link_into_clangs_module_exactly(monkeypatch, tmp_path):
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(tmp_path))
    monkeypatch.setattr(choosing, 'COMPILE_BUDGET', 1e-9)     # nothing fits but tcc's straight-line parts
    monkeypatch.setattr(choosing, 'COMPILE_SECONDS', {**COMPILE_SECONDS, ('tcc', None): 0.0})
    monkeypatch.setattr(choosing, 'STATEMENTS_PER_CALL', 1e15)  # and the module's part costs nothing
    samples = [[math.sin(k + i) for i in range(8)] for k in range(3)]
    m = assert_matches_interpreter(chain_graph(), samples, [0.3, -0.7], None)
    assert m.build.toolchain.family == 'clang' and m.build.straight_toolchain.family == 'tcc'
    assert '(straight-line parts tcc)' in m.summary()
    source = m.source
    for name, text in source.parts:
        tc = m.build.straight_toolchain if name in source.straight else m.build.toolchain
        flags = m.build.straight_flags if name in source.straight else m.build.flags
        assert (tmp_path / (cache.build_key(text, tc, ['-c', *flags]) + '.o')).exists(), name
    # the linker was told that tcc's objects need no executable stack
    headers = subprocess.run(['readelf', '-lW', m.build.path], capture_output=True, text=True).stdout
    stack = [line for line in headers.splitlines() if 'GNU_STACK' in line]
    assert stack and 'RWE' not in stack[0], headers


def test_a_huge_program_is_built_in_a_bounded_number_of_parts():
    # each part is a compiler process forked from Python: a million-statement
    # program must not become hundreds of them
    from compiler.codegen import _Functions
    from compiler.constants import MAX_PARTS, PART
    params = ('double *restrict v', 'v')
    for n_functions, expected in ((3, 1), (40, 10), (2000, MAX_PARTS)):
        f = _Functions()
        for _ in range(n_functions):
            f.define('forward', params, ['    v[1] = v[0] * v[0];'] * 1000)
        parts = f.parts()
        assert sum(map(len, parts)) == n_functions
        assert len(parts) == expected if expected < MAX_PARTS else MAX_PARTS - 1 <= len(parts) <= MAX_PARTS + 1
        assert f.statements // len(parts) >= min(PART, f.statements) or len(parts) == 1


def test_plan_is_the_request_compile_builds(tmp_path, monkeypatch):
    """``compile()`` decides nothing about flags: ``plan`` does, and its
    request is what gets built."""
    monkeypatch.setenv('MICROGRAD_CACHE_DIR', str(tmp_path))
    m = compile_tiny(cc=FAST_CC, opt=None)
    request = plan(m.source, cc=FAST_CC)
    assert isinstance(request, BuildRequest) and request.default and request.timeout > 0
    assert list(request.flags) == m.build.flags and request.toolchain == m.build.toolchain
    again = build_extension(request)
    assert again.cached and again.path == m.build.path and again.sha256 == m.build.sha256
    with pytest.raises(TypeError, match='in the request'):
        build_extension(request, flags=['-O1'])
    with pytest.raises(ValueError, match='-Ofast'):
        plan(request.source, cc=FAST_CC, opt='-Ofast', flags=['-O1'])   # refused even with flags=


def headers_read(text):
    """The headers gcc reads for a translation unit's text (with -DNN_PYTHON,
    as the builds pass it, and Python's headers)."""
    r = subprocess.run(['gcc', '-E', '-DNN_PYTHON', '-I', sysconfig.get_paths()['include'], '-x', 'c', '-'],
                       input=text, capture_output=True, text=True, check=True)
    return {os.path.basename(line.split('"')[1]) for line in r.stdout.splitlines() if line.startswith('# ')}


@pytest.mark.skipif(not HAVE['gcc'], reason="gcc is not installed")
def test_only_the_units_with_vector_loops_read_immintrin_h():
    """immintrin.h costs clang 0.1 s and gcc 0.3 s in each unit that reads it:
    the loop kernels read it, Adam's vector steps in the module's unit, and
    nothing else (the straight-line parts, the module's unit with SGD)."""
    model = MLP(20, [16, 4], seed=0)
    x = [Value(0.1 * i) for i in range(20)]
    nodes = model(x)
    for k in range(6000):              # a straight-line tail of several parts
        nodes.append((nodes[-1] * 0.5 + nodes[-1 - k % 3]).tanh())
    loss = sum(nodes[-10:])
    program = run_passes(trace(loss, x, model.parameters()))
    for optimizer, module_reads in ((SGD(lr=0.1), False), (Adam(lr=0.1), True)):
        source = emit_module(program, optimizer=optimizer)
        units = dict(source.parts)
        assert source.straight and 'kernels' in units
        reads = {name: 'immintrin.h' in headers_read(text) for name, text in units.items()}
        assert reads == {name: name == 'kernels' or name == 'module' and module_reads for name in units}, reads
