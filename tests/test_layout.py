"""The direction of flow through the three packages, read from the imports.

engine -> trace -> passes -> codegen -> build -> load -> export -> model:
each stage imports only what comes before it, and only what it needs. The
IR (``compiler.ir``) owns the IR's facts and imports nothing of the
compiler; shared constants and file helpers are leaves anyone below them may
use. ``mnist_data`` uses the engine, never the compiler; the library never
imports the command-line helpers (``compiler.cli``), only ``python -m
compiler`` does. Every import counts, at module level or inside a function,
and no chain of imports may lead back to where it started.
"""
import ast
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ('micrograd', 'compiler', 'mnist_data')

# module (or package) -> the project modules it may import; every project
# import not listed is a violation, and every module of the three packages
# must have an entry (a package's entry covers its submodules, except
# ``compiler``'s, which is its __init__ alone). ``micrograd`` is the engine.
ALLOWED = {
    'micrograd': {'micrograd'},
    'mnist_data': {'micrograd'},
    'compiler.ir': set(),
    'compiler.constants': set(),
    'compiler.files': set(),
    'compiler.optim': set(),
    'compiler.templates': set(),
    'compiler.cpu': {'compiler.constants'},   # the vector sets this machine's builds carry
    'compiler.pages': set(),        # numpy's huge-page hint, off while compile()'s front end runs
    'compiler.trace': {'micrograd', 'compiler.ir', 'compiler.walk'},
    # the tracer's walk in C: built and loaded as the modules are (once, cached)
    'compiler.walk': {'compiler.build', 'compiler.load', 'compiler.templates'},
    'compiler.vectorize': {'compiler.ir'},
    'compiler.loops': {'compiler.ir'},
    'compiler.positions': {'compiler.ir'},
    'compiler.conv': {'compiler.ir'},
    'compiler.passes': {'compiler.vectorize', 'compiler.conv', 'compiler.loops', 'compiler.positions'},
    'compiler.invariant': {'compiler.ir'},
    'compiler.codegen': {'compiler.ir', 'compiler.invariant', 'compiler.constants', 'compiler.templates',
                         'compiler.optim', 'compiler.cpu'},
    # the build package, in the order a build meets its stages (see compiler/build/__init__.py)
    'compiler.build.errors': set(),
    'compiler.build.process': set(),
    'compiler.build.flags': set(),
    'compiler.build.verify': {'compiler.build.process'},
    'compiler.build.toolchain': {'compiler.build.errors'},
    'compiler.build.cache': {'compiler.build.errors', 'compiler.build.toolchain', 'compiler.build.verify',
                             'compiler.files'},
    'compiler.build.run': {'compiler.build.cache', 'compiler.build.errors', 'compiler.build.process',
                           'compiler.build.toolchain', 'compiler.build.verify', 'compiler.files'},
    'compiler.build.request': {'compiler.build.cache', 'compiler.build.flags', 'compiler.build.toolchain'},
    'compiler.build.choice': {'compiler.build.errors', 'compiler.build.flags', 'compiler.build.process',
                              'compiler.build.request', 'compiler.build.toolchain'},
    'compiler.build.extension': {'compiler.build.cache', 'compiler.build.errors', 'compiler.build.process',
                                 'compiler.build.request', 'compiler.build.run', 'compiler.build.verify',
                                 'compiler.files'},
    'compiler.load': set(),
    'compiler.summary': {'compiler.ir'},
    'compiler.weights': {'compiler.files'},
    'compiler.export': {'compiler.build', 'compiler.codegen', 'compiler.cpu', 'compiler.files', 'compiler.load'},
    'compiler.model': {'compiler.ir', 'compiler.weights', 'compiler.export', 'compiler.summary',
                       'compiler.build.process', 'compiler.constants'},
}
# the build package's face (compiler/build/__init__.py) re-exports its own modules
ALLOWED['compiler.build'] = {k for k in ALLOWED if k.startswith('compiler.build.')}
LIBRARY = {'micrograd', *ALLOWED} - {'mnist_data'}
ALLOWED['compiler'] = LIBRARY                                  # the package: compile(), load()...
ALLOWED['compiler.cli'] = {'compiler.files'}                   # the scripts' shared command line
ALLOWED['compiler.__main__'] = LIBRARY | {'compiler', 'compiler.cli'}


def module_names():
    """Every module of the three packages, as dotted names."""
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob('*.py')):
            parts = path.relative_to(REPO).with_suffix('').parts
            yield '.'.join(parts[:-1] if parts[-1] == '__init__' else parts), path


MODULES = dict(module_names())


def is_package(module):
    return (REPO / module.replace('.', '/') / '__init__.py').exists()


def resolve(name):
    """The module a dotted name lives in: ``compiler.build.BuildError`` ->
    ``compiler.build``, ``compiler.compile`` -> ``compiler``."""
    parts = name.split('.')
    while len(parts) > 1 and '.'.join(parts) not in MODULES:
        parts.pop()
    return '.'.join(parts)


def project_imports(source, module):
    """The project modules ``source`` imports anywhere (functions too), as
    dotted module names, relative imports resolved against ``module``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = module.split('.')
                parent = parts[:len(parts) - node.level + (1 if is_package(module) else 0)]
                base = '.'.join(parent + ([base] if base else []))
            names = [f'{base}.{a.name}' for a in node.names]
        else:
            continue
        found.update(resolve(n) for n in names if n.split('.')[0] in PACKAGES)
    return found - {module}


def owner(name):
    """The ``ALLOWED`` entry a module belongs to (the longest matching prefix;
    ``compiler`` only for the package itself), or None."""
    if name == 'compiler':
        return name
    keys = [k for k in ALLOWED if k != 'compiler' and (name == k or name.startswith(k + '.'))]
    return max(keys, key=len) if keys else None


def violations(module, source):
    rule, mine = ALLOWED[owner(module)], owner(module)
    return sorted(name for name in project_imports(source, module)
                  if owner(name) != mine and owner(name) not in rule)


def import_graph(changed=None):
    """module -> the modules it imports, for every module (``changed``:
    ``{module: source}`` read instead of the files, to test the test)."""
    sources = {name: path.read_text() for name, path in MODULES.items()}
    sources.update(changed or {})
    return {name: project_imports(source, name) for name, source in sources.items()}


def cycles(graph):
    """Every strongly connected set of more than one module (Tarjan), each
    as a sorted list: modules that import each other, directly or not."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_of_the_three_packages_has_a_rule():
    assert len(MODULES) > 30
    assert [m for m in MODULES if owner(m) is None] == [], "add the new module to ALLOWED"


@pytest.mark.parametrize('module', sorted(MODULES))
def test_each_module_imports_only_what_comes_before_it(module):
    assert violations(module, MODULES[module].read_text()) == [], \
        f"{module} imports against the direction of flow"


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_the_rules_themselves_flow_one_way():
    rules = {k: {owner(a) for a in v} - {k} for k, v in ALLOWED.items()}
    assert cycles(rules) == []


@pytest.mark.parametrize('module, line', [
    ('micrograd.engine', 'from compiler import trace'),
    ('compiler.trace', 'from compiler.codegen import emit_module'),
    ('compiler.vectorize', 'from compiler.codegen.scalar import c_double'),
    ('compiler.vectorize', 'import compiler.build'),
    ('compiler.codegen.matvec', 'from compiler.vectorize import vectorize'),
    ('compiler.codegen.scalar', 'from compiler import trace'),
    ('compiler.build', 'from compiler.codegen import GENERATOR_VERSION'),
    ('compiler.build.cache', 'from compiler.codegen import GENERATOR_VERSION'),
    ('compiler.build.verify', 'from compiler.build.extension import build_extension'),
    ('compiler.build.cache', 'from compiler.build.run import run_compiler'),
    ('compiler.ir', 'from compiler.constants import ROW_BLOCK'),
    ('compiler.export', 'def load(folder):\n    from compiler.model import CompiledModel'),
    ('compiler.weights', 'from compiler.cli import OutputPathError'),
    ('compiler.model', 'import compiler.cli'),
    ('compiler', 'from compiler import cli'),
    ('mnist_data.download', 'from compiler.files import atomic_write'),
    ('mnist_data.model', 'def f():\n    import compiler\n    return compiler.compile'),
    ('micrograd.nn', 'from mnist_data import N_PIXELS'),
    ('compiler.summary', 'from compiler import compile'),
])
def test_the_rule_catches_an_import_against_the_flow(module, line):
    assert violations(module, line + '\n') != []


@pytest.mark.parametrize('module, line', [
    ('compiler.codegen.matvec', 'def f():\n    from compiler.codegen import emit_module'),
    ('compiler.codegen.layout', 'from compiler.codegen.matvec import MatVecRenderer'),
    ('micrograd.engine', 'from micrograd.nn import MLP'),
    ('mnist_data.idx', 'from mnist_data import folder'),
    ('compiler.ir', 'def f():\n    from compiler import compile'),
])
def test_the_cycle_check_catches_a_cycle_the_rules_allow_or_miss(module, line):
    source = MODULES[module].read_text() + '\n' + line + '\n'
    assert cycles(import_graph({module: source})) != []


def test_the_rule_allows_what_each_stage_needs():
    assert violations('compiler.vectorize', 'from compiler.ir import MatVec\n') == []
    assert violations('compiler.codegen', 'from compiler.codegen import matvec, sums\n') == []
    assert violations('compiler.codegen.matvec', 'from compiler.constants import ROW_BLOCK\n') == []
    assert violations('compiler.build.cache', 'from compiler.files import sha256_file\n') == []
    assert violations('compiler.build.extension', 'from compiler.build.run import run_compiler\n') == []
    assert violations('compiler.model', 'from compiler.export import open_folder\n') == []
    assert violations('compiler.__main__', 'from compiler.cli import run_cli\n') == []


def test_the_wheel_holds_the_packages_and_their_c_files(tmp_path):
    """The fixed C ships inside the compiler package; nothing else is top level.
    Built as ``pip install`` builds it (an isolated build environment), so the
    test needs nothing the README's install step does not bring."""
    r = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', '-w', str(tmp_path),
                        str(REPO)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"pip wheel failed:\n{r.stdout}\n{r.stderr}"
    wheel, = tmp_path.glob('*.whl')
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split('/')[0] for n in names if not n.split('/')[0].endswith('.dist-info')}
    assert top == {'micrograd', 'compiler', 'mnist_data'}
    shipped = {n.rsplit('/', 1)[1] for n in names if n.startswith('compiler/templates/')}
    on_disk = {p.name for p in (REPO / 'compiler' / 'templates').iterdir() if p.suffix in ('.c', '.h')}
    assert on_disk and on_disk <= shipped


def test_a_checkout_runs_without_an_install(tmp_path):
    """``PYTHONPATH=<checkout>``: the templates are found inside the package,
    and a small graph compiles and runs."""
    script = ('import compiler, numpy as np\nfrom micrograd import Value\n'
              'x = Value(0.0); w = Value(3.0)\n'
              'm = compiler.compile((x * w).relu(), inputs=[x], params=[w], cc="gcc")\n'
              'm.set_input([2.0]); print(m.forward())\n'
              'assert compiler.__file__.startswith(%r), compiler.__file__\n' % str(REPO))
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    env['PYTHONPATH'] = str(REPO)
    r = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env=env)
    assert r.stdout.strip() == '6.0', r.stderr


def test_compile_finds_its_template_from_any_working_directory(tmp_path):
    script = ('import compiler\nfrom micrograd import Value\nx = Value(0.0)\n'
              'src = compiler.emit_module(compiler.trace(x * 2.0, [x]))\n'
              'assert "PyInit_nn" in src\nprint("ok")\n')
    env = dict(os.environ, PYTHONPATH=str(REPO))     # installed or not
    r = subprocess.run([sys.executable, '-c', script], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, env=env)
    assert r.stdout.strip() == 'ok', r.stderr
