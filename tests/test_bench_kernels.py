"""``benchmarks/bench_kernels.py`` (the loops alone, one checkout against
another) builds and runs: the loops' C of a checkout must still assemble into
kernel_loops.c's harness, and two builds of the same loops give the same
bits. Nothing here is about speed."""
import shutil
from pathlib import Path

import pytest

from benchmarks import bench_kernels

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(shutil.which('clang') is None, reason='needs clang')
def test_the_loops_alone_build_run_and_agree_with_themselves(capsys):
    best = bench_kernels.main(['--against', str(REPO), '--sizes', '50', '--isa', 'avx2,base', '--rounds', '1'])
    for isa in ('avx2', 'base'):
        this, other = best[isa, 50, 'this'], best[isa, 50, 'other']
        assert this[2] == other[2]                       # the same checksum: the same bits
        assert all(ms > 0 for ms in this[0])             # forward, weight and input gradient ran
        assert all(rate > 0 for rate in this[1])         # and counted their work
    assert 'same bits' in capsys.readouterr().out
