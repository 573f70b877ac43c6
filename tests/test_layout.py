"""The direction of flow through the compiler, read from the imports.

engine -> trace -> passes -> codegen -> build -> load: each stage imports only
what comes before it, and only what it needs. The IR (``compiler.ir``) owns
the IR's facts and imports nothing of the compiler; shared constants and file
helpers are leaves anyone below them may use.
"""
import ast
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent

# module (or package) -> the project modules it may import; every project
# import not listed is a violation. ``micrograd`` is the engine.
ALLOWED = {
    'micrograd': {'micrograd'},
    'compiler.ir': set(),
    'compiler.constants': set(),
    'compiler.files': set(),
    'compiler.optim': set(),
    'compiler.templates': set(),
    'compiler.trace': {'micrograd', 'compiler.ir'},
    'compiler.vectorize': {'compiler.ir'},
    'compiler.codegen': {'compiler.codegen', 'compiler.ir', 'compiler.constants',
                         'compiler.templates', 'compiler.optim'},
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
    'compiler.build': {'compiler.build'},      # the package's face: its own modules
    'compiler.load': set(),
}


def project_imports(source, module):
    """The project modules (``micrograd``, ``compiler``...) ``source`` imports,
    as dotted names, relative imports resolved against ``module``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parent = module.split('.')[:len(module.split('.')) - node.level + (1 if is_package(module) else 0)]
                base = '.'.join(parent + ([base] if base else []))
            names = [f'{base}.{a.name}' for a in node.names] + [base]
        else:
            continue
        found.update(n for n in names if n.split('.')[0] in ('micrograd', 'compiler', 'mnist_data'))
    return found


def is_package(module):
    return (REPO / module.replace('.', '/') / '__init__.py').exists()


def owner(name):
    """The ``ALLOWED`` entry a dotted name belongs to (the longest matching prefix)."""
    best = None
    for key in ALLOWED:
        if name == key or name.startswith(key + '.'):
            if best is None or len(key) > len(best):
                best = key
    return best or name


def violations(module, source):
    rule = ALLOWED[owner(module)]
    bad = []
    for name in sorted(project_imports(source, module)):
        target = owner(name)
        if target == owner(module) or any(target == a or target.startswith(a + '.') for a in rule):
            continue
        # `from compiler.codegen import scalar` names compiler.codegen.scalar and compiler.codegen
        if name in ('compiler', 'micrograd') and any(n.startswith(name + '.') for n in project_imports(source, module)):
            continue
        bad.append(name)
    return bad


def modules():
    """Every project module governed by ``ALLOWED``, with its source."""
    folders = {'micrograd': REPO / 'micrograd', 'compiler': REPO / 'compiler'}
    for prefix, folder in folders.items():
        for path in sorted(folder.rglob('*.py')):
            rel = path.relative_to(folder).with_suffix('')
            parts = [p for p in rel.parts if p != '__init__']
            name = '.'.join([prefix, *parts])
            if owner(name) in ALLOWED and name != 'compiler':
                yield name, path.read_text()


@pytest.mark.parametrize('module, source', list(modules()), ids=lambda x: x if '\n' not in x else '')
def test_each_stage_imports_only_the_stages_before_it(module, source):
    assert violations(module, source) == [], f"{module} imports against the direction of flow"


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
])
def test_the_rule_catches_an_import_against_the_flow(module, line):
    assert violations(module, line + '\n') != []


def test_the_rule_allows_what_each_stage_needs():
    assert violations('compiler.vectorize', 'from compiler.ir import MatVec\n') == []
    assert violations('compiler.codegen', 'from compiler.codegen import matvec, sums\n') == []
    assert violations('compiler.codegen.matvec', 'from compiler.constants import ROW_BLOCK\n') == []
    assert violations('compiler.build.cache', 'from compiler.files import sha256_file\n') == []
    assert violations('compiler.build.extension', 'from compiler.build.run import run_compiler\n') == []


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
