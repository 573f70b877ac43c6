"""A model shows itself in a notebook: the summary as an HTML table
(escaped), the drawing as SVG and PNG where Graphviz is present, None where
it is not (Jupyter then shows another form)."""
import shutil
import sys

import pytest

import compiler
from tests.differential import FAST_CC, needs_cc
from tests.test_summary import small_mlp

needs_dot = pytest.mark.skipif(not shutil.which('dot'), reason="Graphviz's dot is not installed")


@pytest.fixture(scope='module')
def model():
    loss, inputs, params, outputs = small_mlp()
    loss.label = '<x&0>'                       # a label that is HTML (the summary shows outputs' labels)
    if not FAST_CC:
        pytest.skip('no C compiler installed')
    return compiler.compile(loss, inputs, params, outputs, cc=FAST_CC)


@needs_cc
def test_the_html_is_the_summary_as_a_table_escaped(model):
    page = model._repr_html_()
    text = model.summary().splitlines()
    assert page.startswith('<table>') and page.count('<tr>') == 1 + len(text) - 8   # head, one per part
    assert '<th style="text-align: left">shape / ops</th>' in page
    assert '&lt;x&amp;0&gt;' in page and '<x&0>' not in page
    assert 'MatVec' in page and '4 -&gt; 8 (W 8x4, heads)' in page
    for note in text[-5:]:                     # the totals below the table
        assert note.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;') in page


@needs_cc
@needs_dot
def test_the_drawing_is_svg_and_png(model):
    pytest.importorskip('graphviz')
    svg = model._repr_svg_()
    assert isinstance(svg, str) and '<svg' in svg and 'W 8x4' in svg and 'relu x8' in svg
    assert model._repr_png_()[:8] == b'\x89PNG\r\n\x1a\n'


@needs_cc
def test_without_graphviz_there_is_no_drawing_and_no_error(model, monkeypatch):
    monkeypatch.setenv('PATH', '')              # no dot program
    assert model._repr_svg_() is None and model._repr_png_() is None
    monkeypatch.setitem(sys.modules, 'graphviz', None)     # no graphviz package
    assert model._repr_svg_() is None and model._repr_png_() is None
    assert model._repr_html_().startswith('<table>')      # the summary needs neither


@needs_cc
def test_a_model_loaded_from_an_export_shows_its_summary(model, tmp_path):
    model.export(tmp_path / 'model')
    loaded = compiler.load(tmp_path / 'model')
    assert loaded._repr_html_() == f'<p>{loaded.summary()}</p>'.replace('&', '&amp;')
    assert loaded._repr_svg_() is None and loaded._repr_png_() is None
