"""How a fold's terms are cut into loops (compiler/codegen/sums.py): runs of
terms whose places move by one step in every column, the rest single."""
import random

from compiler.codegen.sums import MIN_RUN, NOWHERE, Place, _segments


def segments_by_definition(columns, ok=None):
    """The segments, term by term from the definition: a run from j goes on
    while every column's next place is in j's array, with j's step, its base
    j's plus the move from j to j + 1 times the distance, and ``ok`` holds."""
    n, out, j = len(columns[0]), [], 0

    def goes_on(col, end, move):
        p, q = col[j], col[end]
        return (p.base is not None and q.base is not None and q.array == p.array and q.step == p.step
                and q.base == p.base + move * (end - j))
    while j < n:
        end = j + 1
        if end < n and (ok is None or ok[j]) and all(c[j].base is not None and c[end].base is not None
                                                     for c in columns):
            moves = [c[j + 1].base - c[j].base for c in columns]
            while end < n and all(goes_on(c, end, m) for c, m in zip(columns, moves)) and (ok is None or ok[end]):
                end += 1
        if end - j >= MIN_RUN:
            out.append((j, end - j, moves))
            j = end
        else:
            out.append((j, 1, None))
            j += 1
    return out


def random_column(rng, n):
    """Places mostly in progressions of a few lengths and moves, some in other
    arrays or steps, some without a base."""
    col = []
    while len(col) < n:
        kind = rng.random()
        if kind < 0.1:
            col.append(NOWHERE)
        elif kind < 0.2:
            col.append(Place('v', None, 0, 'v[at0[i]]'))
        else:
            array, step, base, move = rng.choice('vp'), rng.choice([0, 0, 1, 3]), rng.randrange(100), rng.choice([0, 1, 2, -1])
            col += [Place(array, base + move * k, step, '') for k in range(rng.randrange(1, 9))]
    return col[:n]


def test_the_segments_are_the_definitions_on_random_columns():
    rng = random.Random(4)
    for _ in range(3000):
        n = rng.randrange(1, 20)
        columns = [random_column(rng, n) for _ in range(rng.randrange(1, 5))]
        ok = [rng.random() < 0.85 for _ in range(n)] if rng.random() < 0.5 else None
        assert _segments(columns, ok) == segments_by_definition(columns, ok), (columns, ok)


def test_a_term_that_is_not_ok_is_single_even_where_a_run_starts():
    col = [Place('v', 10 + k, 0, '') for k in range(8)]
    ok = [False] + [True] * 7
    assert _segments([col], ok) == [(0, 1, None), (1, 7, [1])]
    ok = [True] * 4 + [False] + [True] * 3
    assert _segments([col], ok) == [(0, 4, [1]), (4, 1, None), (5, 1, None), (6, 1, None), (7, 1, None)]


def test_a_run_ends_where_any_column_stops_moving_by_its_step():
    a = [Place('v', k, 0, '') for k in range(10)]
    b = [Place('p', 2 * k, 1, '') for k in range(6)] + [Place('p', 50 + k, 1, '') for k in range(4)]
    assert _segments([a, b]) == [(0, 6, [1, 2]), (6, 4, [1, 1])]
