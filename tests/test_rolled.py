"""Position loops (compiler/codegen/rolled.py): the scalar code that is the
same at consecutive positions of a sequence, written once as a function of
the position, gives the interpreter's bits for every number of positions."""
import random
import re

import pytest

from compiler.codegen import rolled
from microgpt import Config

from tests.differential import COMPILERS, FAST_CC, needs_cc
from tests.test_positions import assert_positions_match, compile_gpt, gpt_case


def instantiate(text, decls, first, t):
    """``text`` (a template of positions from ``first``) at position ``t``:
    each table read and each moving integer the template wrote, evaluated."""
    tables = {}
    for decl in decls:
        name, values = re.fullmatch(r'static const int (\w+)\[\d+\] = \{(.*)\};', decl).groups()
        tables[name] = [int(v) for v in values.split(', ')]
    text = re.sub(rf'(\w+)\[{rolled.POS}(?: - (\d+))?\]', lambda m: str(tables[m[1]][t - int(m[2] or 0)]), text)
    text = re.sub(rf'\b{rolled.POS}\b', str(t), text)
    # the forms template writes: N + D * t, N - D * t, D * t, N + M, bare or in brackets
    form = r'-?\d+ [+-] \d+ \* \d+|\d+ \* \d+|-?\d+ \+ -?\d+'
    return re.sub(rf'\(({form})\)|(?<=\[)({form})(?=[\] ])', lambda m: str(eval(m[1] or m[2])), text)


def test_integers_that_move_by_a_step_or_otherwise_come_back_at_every_position():
    texts = [f'v[{100 + 10 * t}] = v[{7 + [0, 3, 4, 9][t]}] * p[{5}] + 0x1.8p+0;\n'
             f'for (int k = 0; k < {2 + t}; k++) acc += v[{300 - 2 * t}] * {3 * t}; /* gp[{40 + [0, 3, 4, 9][t]}] */'
             for t in range(4)]
    for first in (0, 3):
        text, decls = rolled.template([rolled.split(t) for t in texts], first, lambda j: f'moves{j}')
        assert len(decls) == 1, decls        # the one sequence that is not a step, once for its two uses
        assert 'p[5]' in text and '0x1.8p+0' in text
        assert [instantiate(text, decls, first, first + t) for t in range(4)] == texts


def test_a_static_table_whose_numbers_move_is_not_rolled():
    """A loop's table of places is a static initializer: it cannot read pos."""
    def text(t):
        return f'{{\n    static const int at0[3] = {{4, {9 + t}, 2}};\n    v[{10 + t}] = v[at0[1]];\n}}'
    assert rolled.template([rolled.split(text(t)) for t in range(3)], 0, str) is None
    steady = [f'{{\n    static const int at0[3] = {{4, 9, 2}};\n    v[{10 + t}] = v[at0[1]];\n}}' for t in range(3)]
    body, decls = rolled.template([rolled.split(t) for t in steady], 0, str)
    assert 'at0[3] = {4, 9, 2};' in body and 'v[10 + 1 * pos]' in body and not decls


def test_floating_literals_identifiers_and_other_integers_never_move():
    def pieces(text):
        pieces, integers = rolled.split(text)
        assert ''.join(p + n for p, n in zip(pieces, integers + [''])) == text
        return pieces
    for a, b in [('1e-05', '1e-06'), ('1e5', '1e6'), ('2.5', '2.25'), ('.5', '.25'), ('0x1p-1', '0x1p-2'),
                 ('0x1.8p+0', '0x1.8p+1'), ('seg1(x)', 'seg2(x)'), ('8L', '9L'), ('0x1F', '0x2F'),
                 ('010', '011'), ('12345678901234567890', '12345678901234567891')]:
        assert pieces(f'v[3] = {a} * x2;') != pieces(f'v[3] = {b} * x2;'), (a, b)
    assert pieces('v[3] = x2 - 5;') == pieces('v[41] = x2 - 7;')


GPT = Config(vocab_size=5, n_embd=8, n_layer=2, n_head=2, block_size=7)


@needs_cc
@pytest.mark.parametrize('cc', COMPILERS)
def test_microgpt_with_position_loops_matches_the_interpreter_for_every_n(cc):
    _, graph = gpt_case(seed=11, config=GPT)
    m = compile_gpt(graph, cc, config=GPT)
    # loops over positions, forward and backward, some reading tables of moves
    assert re.search(r'for \(int pos = 0; pos <= \d+ && pos < b->upto; pos\+\+\)', m.source)
    assert re.search(r'for \(int pos = \(b->upto <= \d+ \? b->upto - 1 : \d+\); pos >= \d+; pos--\)', m.source)
    assert 'static const int pos_moves' in m.source
    T = GPT.block_size
    assert_positions_match(m, graph, random.Random(12), [T, 1, 2, 5, 3, T, 6, 4, 1], config=GPT)



@needs_cc
def test_stretches_of_a_group_that_starts_at_a_later_position_keep_their_positions(monkeypatch):
    """Each group's runs cut after its first position: the groups of
    positions 1, 2, ... roll as stretches that start at position 1."""
    from compiler.codegen import program
    whole = program._position_groups

    def cut(runs):
        return [part for group in whole(runs) for part in ([group[:1], group[1:]] if len(group) > 2 else [group])]
    monkeypatch.setattr(program, '_position_groups', cut)
    _, graph = gpt_case(seed=13, config=GPT)
    m = compile_gpt(graph, FAST_CC, config=GPT)
    assert re.search(r'for \(int pos = 1; pos <= \d+ && pos < b->upto; pos\+\+\)', m.source)
    assert re.search(r'\[pos - 1\]', m.source)       # a table read from position 1
    T = GPT.block_size
    assert_positions_match(m, graph, random.Random(14), [T, 1, 2, 5, 3, T, 6], config=GPT)
