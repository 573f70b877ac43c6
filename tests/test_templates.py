"""The fixed C of compiler/templates/ is real C: no placeholders, and each
file compiles on its own, with every installed compiler, against a stub of
the prologue codegen writes; the numbers C shares with Python come from
compiler/constants.py, as the prologue's #defines."""
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from compiler import constants
from compiler.codegen.module import TEMPLATES
from tests.differential import COMPILERS
from tests.graphs import compile_small

TEMPLATES_DIR = Path(constants.__file__).parent / 'templates'

STUB = '''\
#define N_INPUTS 3
#define N_PARAMS 4
#define N_OUTPUTS 2
#define N_FEATURES 3
#define N_SHARED 8
#define N_PARAM_SPAN 8
#define N_WEIGHT_BLOCKS 1
#define N_OTHER_SPANS 1
#define N_AUX 1
#define ROW_VALUES 8
#define ROW_STRIDE 8
#define ROW_ZERO 8
#define BLOCK 4
#define SCRATCH_BYTES 64
#define POSITIONS 0
#define N_PIPELINED 0
#define RECORDED 1
#define WORK_PER_ROW 10
#define N_PARAM_RUNS 1
#define N_ROW_INPUT_RUNS 1
#define NN_PROGRAM_HASH "0"
#define NN_GRAPH_HASH "0"
#define NN_KERNELS_ALLOWED "base"
#define LOSS_OF(row, p) ((row)[0])
''' + ''.join(f'#define {name} {value}\n' for name, value in constants.C_DEFINES.items())


def test_no_template_needs_substitution():
    for path in TEMPLATES_DIR.iterdir():
        if path.suffix in ('.c', '.h'):
            assert '${' not in path.read_text(), f"{path.name} has a ${{...}} placeholder"


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('name', TEMPLATES)
def test_each_template_compiles_on_its_own_against_a_stub_prologue(tmp_path, cc, name):
    (tmp_path / 'nn_prologue.h').write_text(STUB)
    unit = tmp_path / 'unit.c'
    unit.write_text(f'#include "{name}"\n')        # (tcc compiles .c files only)
    include = ['-I', str(tmp_path), '-I', str(TEMPLATES_DIR), '-I', sysconfig.get_paths()['include']]
    if cc == 'tcc':
        command = [shutil.which(cc), '-c', '-o', str(tmp_path / 'unit.o'), *include, str(unit)]
    else:
        command = [shutil.which(cc), '-fsyntax-only', '-std=c11', '-D_GNU_SOURCE',
                   '-Werror=implicit-function-declaration', *include, str(unit)]
    r = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{cc} {name}:\n{r.stderr}"


@pytest.mark.parametrize('cc', COMPILERS[:1])
def test_a_template_missing_a_number_of_the_prologue_does_not_compile(tmp_path, cc):
    """The test above can fail: without the prologue's N_PARAM_RUNS, core.c is not C."""
    (tmp_path / 'nn_prologue.h').write_text(STUB.replace('#define N_PARAM_RUNS 1\n', ''))
    (tmp_path / 'unit.c').write_text('#include "core.c"\n')
    r = subprocess.run([shutil.which(cc), '-c', '-o', str(tmp_path / 'unit.o'), '-I', str(tmp_path),
                        '-I', str(TEMPLATES_DIR), str(tmp_path / 'unit.c')], capture_output=True, text=True)
    assert r.returncode != 0 and 'N_PARAM_RUNS' in r.stderr


def test_the_numbers_shared_with_python_have_one_home():
    """The kernels' tile sizes and the thread cap reach C from constants.py
    only: no template defines them, the generated prologue does."""
    for path in TEMPLATES_DIR.iterdir():
        if path.suffix in ('.c', '.h'):
            for name in constants.C_DEFINES:
                assert not re.search(rf'#define\s+{name}\b', path.read_text()), f"{path.name} defines {name}"
    source = compile_small('tcc' if 'tcc' in COMPILERS else COMPILERS[0]).source
    for name, value in constants.C_DEFINES.items():
        assert re.search(rf'^#define {name} {value}\b', source, re.M), name
    assert not hasattr(constants, 'ZERO_GROUP') and not hasattr(constants, 'OUT_BLOCK')


def test_the_package_still_offers_the_module_assembly():
    from compiler.codegen import GENERATOR_VERSION, Source, c_double, emit_module
    from compiler.codegen import module
    assert emit_module is module.emit_module and Source is module.Source
    assert GENERATOR_VERSION == module.GENERATOR_VERSION and float.fromhex(c_double(0.5)) == 0.5
