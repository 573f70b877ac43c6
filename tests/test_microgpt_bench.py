"""``benchmarks/bench_microgpt.py --quick`` runs end to end and reports every field.

Nothing here is about speed: what is checked is that the run completes, that
its JSON has its fields, and that the interpreter's losses are ours bit for
bit (and PyTorch's close to them: the same model from the same weights).
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.differential import FAST_CC

BENCH = Path(__file__).resolve().parent.parent / 'benchmarks' / 'bench_microgpt.py'
RESULT_FIELDS = {'name', 'runs', 'repeats', 'losses', 'steps_timed', 'ms_per_step', 'ms_per_step_median',
                 'ours_faster', 'loss_first100', 'loss_last100'}


@pytest.mark.skipif(FAST_CC is None, reason='no C compiler installed')
def test_quick_run_reports_every_field(tmp_path):
    out = tmp_path / 'bench.json'
    r = subprocess.run([sys.executable, str(BENCH), '--quick', '--cc', FAST_CC, '--json', str(out)],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert '| system | compile s |' in r.stdout and 'targets:' in r.stdout
    report = json.loads(out.read_text())
    assert report['config']['steps'] == 30 and report['config']['interpreter_steps'] == 3
    ours, interp, *rest = report['results']
    for row in report['results']:
        assert RESULT_FIELDS <= set(row), row['name']
    assert ours['compile_s'] > 0 and ours['steps_timed'] == 30 and ours['ours_faster'] == 1
    assert ours['repeats'] == 2 and len(ours['runs']) == 2 and interp['repeats'] == 1
    assert interp['name'] == 'interpreter' and interp['steps_timed'] == 3
    assert interp['identical_steps'] == 3 and interp['losses'] == ours['losses'][:3]
    for row in rest:        # PyTorch, where installed
        assert row['steps_timed'] == 30
        assert row['first_loss_relative_difference'] < 1e-12
        assert row['max_abs_loss_difference'] < 1e-9
