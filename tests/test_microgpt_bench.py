"""``benchmarks/bench_microgpt.py --quick`` runs end to end and reports every field.

Nothing here is about speed: what is checked is that the run completes, that
its JSON has its fields, and that the interpreter's losses are ours bit for
bit (and PyTorch's and numpy's close to them: the same model from the same
weights), at the default size and at another.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.differential import FAST_CC

BENCH = Path(__file__).resolve().parent.parent / 'benchmarks' / 'bench_microgpt.py'
RESULT_FIELDS = {'name', 'runs', 'repeats', 'losses', 'steps_timed', 'ms_per_step', 'ms_per_step_median',
                 'ours_faster_median_step',
                 'ours_faster', 'loss_first100', 'loss_last100'}


@pytest.mark.skipif(FAST_CC is None, reason='no C compiler installed')
def test_quick_run_reports_every_field(tmp_path):
    out = tmp_path / 'bench.json'
    r = subprocess.run([sys.executable, str(BENCH), '--quick', '--cc', FAST_CC, '--json', str(out)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert '| system | compile s |' in r.stdout and "targets (issue 23's for the default config):" in r.stdout
    report = json.loads(out.read_text())
    assert report['config']['steps'] == 30 and report['config']['interpreter_steps'] == 3
    ours, interp, *rest = report['results']
    for row in report['results']:
        assert RESULT_FIELDS <= set(row), row['name']
    assert ours['compile_s'] > 0 and ours['steps_timed'] == 30 and ours['ours_faster'] == 1
    assert ours['repeats'] == 2 and len(ours['runs']) == 2 and interp['repeats'] == 1
    assert interp['name'] == 'interpreter' and interp['steps_timed'] == 3
    assert interp['identical_steps'] == 3 and interp['losses'] == ours['losses'][:3]
    assert [row['name'] for row in rest][-1] == 'numpy'
    for row in rest:        # PyTorch, where installed, and numpy
        assert row['steps_timed'] == 30 and row['repeats'] == 2
        assert row['first_loss_relative_difference'] < 1e-12
        assert row['max_abs_loss_difference'] < 1e-9
    assert '| numpy | – | 2 x 30 |' in r.stdout and '| ours faster | (median steps) |' in r.stdout
    assert [t[0] for t in report['targets']].count('ours vs numpy per step') == 1
    assert report['config']['default_size'] and report['config']['params'] == 4192


@pytest.mark.skipif(FAST_CC is None, reason='no C compiler installed')
def test_size_options_reach_every_system(tmp_path):
    """``--n-embd 8 --n-layer 2 --n-head 2 --block-size 6``: ours, the interpreter and
    numpy all train that model (the interpreter's bits, numpy's close losses)."""
    out = tmp_path / 'bench.json'
    r = subprocess.run([sys.executable, str(BENCH), '--quick', '--cc', FAST_CC, '--no-torch', '--json', str(out),
                        '--n-embd', '8', '--n-layer', '2', '--n-head', '2', '--block-size', '6'],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert 'microgpt n_embd 8, 2 layers, 2 heads, block 6, ' in r.stdout
    report = json.loads(out.read_text())
    config = report['config']
    assert (config['n_embd'], config['n_layer'], config['n_head'], config['block_size']) == (8, 2, 2, 6)
    assert config['params'] == 27 * 8 * 2 + 6 * 8 + 2 * 12 * 8 * 8 and not config['default_size']
    assert "targets (issue 23's for a larger config)" in r.stdout
    ours, interp, numpy_row = report['results']
    assert interp['identical_steps'] == 3
    assert numpy_row['name'] == 'numpy' and numpy_row['max_abs_loss_difference'] < 1e-9


def test_n_head_must_divide_n_embd():
    r = subprocess.run([sys.executable, str(BENCH), '--n-embd', '10', '--n-head', '4'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and 'not divisible by --n-head 4' in r.stderr
