"""Shared test setup: a private build cache, so tests never touch the user's."""
import os
import tempfile

import pytest

from tests.differential import FAST_CC
from tests.graphs import compile_small


@pytest.fixture(autouse=True, scope='session')
def private_build_cache():
    with tempfile.TemporaryDirectory(prefix='micrograd-test-cache-') as folder:
        old = os.environ.get('MICROGRAD_CACHE_DIR')
        os.environ['MICROGRAD_CACHE_DIR'] = folder
        yield folder
        if old is None:
            os.environ.pop('MICROGRAD_CACHE_DIR', None)
        else:
            os.environ['MICROGRAD_CACHE_DIR'] = old


@pytest.fixture(scope='module')
def small():
    return compile_small(FAST_CC)
