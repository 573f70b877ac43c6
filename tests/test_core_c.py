"""nn.c is plain C: built with no define at all (or -DNN_NO_THREADS), a C
program that includes only nn.h (emit_header) drives two states of one model through the nn_ functions and gets the
Python module's bits."""
import shutil
import subprocess

import numpy as np
import pytest

from compiler.codegen import emit_module
from compiler.codegen.module import emit_header
from tests.differential import COMPILERS, FAST_CC, compile_graph
from tests.graphs import mlp_builder

MAIN = r'''
#include "nn.h"
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    void *a = malloc(nn_state_size()), *b = malloc(nn_state_size());
    if (a == NULL || b == NULL || nn_init(a) != NN_OK || nn_init(b) != NN_OK)
        return 2;
    double x[NN_N_INPUTS], X[5 * NN_N_INPUTS], params[NN_N_PARAMS], out[NN_N_OUTPUTS], rows[5 * NN_N_OUTPUTS], loss;
    long bad;
    for (int i = 0; i < NN_N_INPUTS; i++)
        x[i] = 0.25 * i - 1.0;
    for (int i = 0; i < 5 * NN_N_INPUTS; i++)
        X[i] = (double)((i * 7) % 11) / 11.0 - 0.5;
    nn_set_input(a, x);
    printf("%a\n", nn_forward(a, -1));
    nn_read_outputs(a, out);
    printf("%a %a\n", out[0], out[NN_N_OUTPUTS - 1]);
    nn_set_threads(b, 3);
    for (int step = 0; step < 3; step++)
        if (nn_train_batch(b, 5, X, 0.1, &loss, &bad) != NN_OK)
            return 3;
    printf("%a\n", loss);
    nn_read_params(b, params);             /* b trained; a did not */
    printf("%a %a\n", params[0], params[NN_N_PARAMS - 1]);
    nn_read_params(a, params);
    printf("%a %a\n", params[0], params[NN_N_PARAMS - 1]);
    if (nn_predict(b, 5, X, rows) != NN_OK)
        return 4;
    printf("%a %a\n", rows[0], rows[5 * NN_N_OUTPUTS - 1]);
    nn_release(a);
    nn_release(b);
    free(a);
    free(b);
    return 0;
}
'''


@pytest.mark.parametrize('cc', COMPILERS)
@pytest.mark.parametrize('threads', [True, False], ids=['threads', 'no-threads'])
def test_a_c_program_drives_two_states_of_the_core_to_the_modules_bits(tmp_path, cc, threads):
    sizes = [6, 20, 3]
    params = list(np.random.default_rng(4).standard_normal(sum((a + 1) * b for a, b in zip(sizes, sizes[1:]))))
    m = compile_graph(mlp_builder(sizes), sizes[0] + sizes[-1], params, FAST_CC)
    # nn.c as export writes it: the model's weights built in, loaded by nn_init
    source = emit_module(m.program, initial_params=m.params())
    (tmp_path / 'nn.c').write_text(str(source))
    (tmp_path / 'nn.h').write_text(emit_header(source))
    (tmp_path / 'main.c').write_text(MAIN)
    flags = [] if threads else ['-DNN_NO_THREADS']
    libs = ['-lm'] + (['-lpthread'] if threads else [])
    exe = tmp_path / 'main'
    # no Python include folder: the core must not need it
    done = subprocess.run([shutil.which(cc), '-O1', '-w', *flags, '-o', str(exe), 'main.c', 'nn.c', *libs],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = [[float.fromhex(v) for v in line.split()] for line in run.stdout.split('\n') if line]
    n_in = m.n_inputs
    x = [0.25 * i - 1.0 for i in range(n_in)]
    X = np.array([((i * 7) % 11) / 11.0 - 0.5 for i in range(5 * n_in)]).reshape(5, n_in)
    m.set_input(x)
    assert lines[0] == [m.forward()]
    assert lines[1] == [m.outputs()[0], m.outputs()[-1]]
    initial = m.params()
    m.threads = 2
    for _ in range(3):
        loss = m.train_batch(X, 0.1)
    assert lines[2] == [loss]
    assert lines[3] == [m.params()[0], m.params()[-1]]
    assert lines[4] == [initial[0], initial[-1]]      # the other state kept its own weights
    predicted = m.predict(X)
    assert lines[5] == [predicted[0, 0], predicted[-1, -1]]


@pytest.mark.skipif(not shutil.which('g++'), reason='no C++ compiler')
def test_nn_h_declares_the_api_for_cpp_too(tmp_path):
    """extern "C": a C++ program links against nn.c built as C."""
    m = compile_graph(mlp_builder([3, 4, 2]), 5, list(np.linspace(-1, 1, 26)), FAST_CC)
    source = emit_module(m.program, initial_params=m.params())
    (tmp_path / 'nn.c').write_text(str(source))
    (tmp_path / 'nn.h').write_text(emit_header(source))
    (tmp_path / 'main.cpp').write_text(MAIN.replace('void *a = malloc', 'void *a = std::malloc')
                                       .replace('#include <stdlib.h>', '#include <cstdlib>'))
    for command in (['gcc', '-c', '-w', 'nn.c'],
                    ['g++', '-w', '-o', 'main', 'main.cpp', 'nn.o', '-lm', '-lpthread']):
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
    run = subprocess.run([str(tmp_path / 'main')], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    m.set_input([0.25 * i - 1.0 for i in range(5)])
    assert float.fromhex(run.stdout.split()[0]) == m.forward()


@pytest.mark.skipif(not (shutil.which('gcc') and shutil.which('nm')), reason='needs gcc and nm')
def test_plain_cc_builds_the_library_and_nn_python_the_module(tmp_path):
    """No define: the nn_ functions exported, no CPython module; -DNN_PYTHON
    (what the compiler's builds pass): the module, the nn_ functions hidden."""
    import sysconfig
    m = compile_graph(mlp_builder([3, 4, 2]), 5, list(np.linspace(-1, 1, 26)), FAST_CC)
    (tmp_path / 'nn.c').write_text(str(emit_module(m.program, initial_params=m.params())))

    def exported_names(*flags):
        done = subprocess.run(['gcc', '-c', '-fPIC', '-w', *flags, '-o', 'nn.o', 'nn.c'], capture_output=True,
                              text=True, cwd=tmp_path, timeout=300)
        assert done.returncode == 0, done.stderr
        done = subprocess.run(['gcc', '-shared', '-o', 'nn.so', 'nn.o', '-lm', '-lpthread'], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        names = subprocess.run(['nm', '-D', '--defined-only', 'nn.so'], capture_output=True, text=True,
                               cwd=tmp_path).stdout.split()
        return set(names)

    plain = exported_names()
    assert 'nn_init' in plain and 'nn_train_batch' in plain and 'PyInit_nn' not in plain
    module = exported_names('-DNN_PYTHON', '-I', sysconfig.get_paths()['include'])
    assert 'PyInit_nn' in module and 'nn_init' not in module
