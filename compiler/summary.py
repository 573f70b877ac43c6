"""What was built, in the user's terms: ``m.summary()`` (a table in the manner
of Keras' ``model.summary()``) and ``m.draw(path)`` (the network as a
picture: vector ops and runs of scalar ops, not every scalar); both as a
notebook shows them (``summary_html``, ``picture``)."""
import html
import os
import re
from collections import Counter

from compiler.ir import Loop, MatMat, MatVec, Op, slot_list


def parts(program):
    """The program as the user would sketch it: ``(kind, ops)`` for each
    vector op (``'MatVec'``) and each run of scalar ops between them
    (``'scalar'``: ``Op`` and ``Sum``), in program order."""
    out = []
    for op in program.ops:
        if type(op) is MatVec or type(op) is MatMat:
            out.append(('MatVec', [op]))
        elif out and out[-1][0] == 'scalar':
            out[-1][1].append(op)
        else:
            out.append(('scalar', [op]))
    return out


def _is_param(program, s):
    return program.param_start <= s < program.param_end


def _params_read(program, ops):
    return {s for op in ops for s in op.reads if _is_param(program, s)}


def _labels(program, slots, limit=3):
    labels = program.labels or {}
    named = [labels[s] for s in slots if s in labels]
    if not named:
        return ''
    return ', '.join(named[:limit]) + (f', ... ({len(named)})' if len(named) > limit else '')


def _describe(program, kind, ops):
    """``(what, shape, parameters it reads (set), labels)`` of one part."""
    if kind == 'MatVec':
        op = ops[0]
        each = op.uses[0] if type(op) is MatMat else op      # a MatMat: one MatVec per position
        heads = 'heads' if each.heads else 'no heads'
        if type(op) is MatMat:
            heads += f', {len(op.uses)} positions at once'
        params = _params_read(program, ops)
        return ('MatVec', f'{each.cols} -> {each.rows} (W {each.rows}x{each.cols}, {heads})', params,
                _labels(program, list(op.writes)))
    # a Loop counts as the ops it runs; Sum and Dot by their names
    counts = Counter(o.name if type(o) is Op else type(o).__name__.lower()
                     for op in ops for o in (op.ops() if type(op) is Loop else (op,)))
    what = ', '.join(f'{name} x{n}' for name, n in counts.most_common())
    outs = [o for op in ops for o in op.writes]
    return ('scalar', f'{sum(counts.values())} ops: {what}', _params_read(program, ops), _labels(program, outs))


NOT_LIFTED_LINES = 3      # per part; a convolution's windows would list every position


def not_lifted(program, ops):
    """The lines saying why rows among ``ops`` that look like a layer stay
    scalar (``Program.not_lifted``, recorded by the vectorizing pass), the
    first few of them, then how many more."""
    entries = getattr(program, 'not_lifted', ())
    if not entries:
        return []
    writes = {o for op in ops for o in op.writes}
    here = [e for e in entries if e.outs and e.outs[0] in writes]
    lines = [f'not lifted: {e.cols} -> {e.rows} ({slot_list(list(e.outs))}): {e.reason}'
             for e in here[:NOT_LIFTED_LINES]]
    if len(here) > NOT_LIFTED_LINES:
        lines.append(f'not lifted: {len(here) - NOT_LIFTED_LINES:,} more such groups of rows '
                     '(m.program.not_lifted lists them all)')
    return lines


def _table(model):
    """The summary as ``(head, rows, notes)``: the column names, one row per
    part (``parts``), and the lines of totals below the table. A scalar part
    with rows that look like a layer has a row of its own per such layer,
    saying why it was not lifted."""
    program = model.program
    rows = []
    seen = set()
    for i, (kind, ops) in enumerate(parts(program), 1):
        what, shape, params, labels = _describe(program, kind, ops)
        new = params - seen
        seen |= params
        rows.append((str(i), what, shape, f'{len(new):,}', labels))
        if kind == 'scalar':
            rows += [('', '', line, '', '') for line in not_lifted(program, ops)]
    head = ('#', 'part', 'shape / ops', 'params', 'labels')
    unused = program.n_params - len(seen)
    b = model.build
    toolchain = b.toolchain.version if b and b.toolchain else 'unknown'
    stages = ', '.join(f'{k} {v:.2f} s' for k, v in model.timings.items())
    notes = [f'inputs {program.n_inputs:,} ({len(model.features):,} that the outputs depend on), '
             f'params {program.n_params:,}' + (f' ({unused:,} unused)' if unused else '')
             + f', outputs {len(program.outputs):,}',
             f'program: {len(program.ops):,} ops over {program.n_slots:,} slots'
             + (f' (passes: {", ".join(program.passes)})' if program.passes else ''),
             f'C: {model.source.count(chr(10)):,} lines; {toolchain} {b.flags_text() if b else ""}'
             + _scalar_code(model.source),
             *_once(model.source),
             f'optimizer: {model.module.optimizer}; threads: {model.threads}',
             f'compile(): {sum(model.timings.values()):.2f} s ({stages})']
    return head, rows, notes


def _exported(model):
    """The summary of a model loaded from an export (no program to describe)."""
    info = getattr(model, 'export_info', {})
    return (f'exported model: {model.n_inputs} inputs, {model.n_params} params, '
            f'{model.n_outputs} outputs; program {info.get("program_hash")}; '
            f'built with {info.get("compiler", {}).get("version")} {" ".join(info.get("flags", []))}')


def summary(model):
    """The summary text of a ``CompiledModel``."""
    if model.program is None:
        return _exported(model)
    head, rows, notes = _table(model)
    width = [max(len(r[c]) for r in rows + [head]) for c in range(5)]
    width[2] = min(max((len(r[2]) for r in rows + [head] if r[0]), default=0), 60)

    def line(r):
        if not r[0] and r[2].startswith('not lifted'):      # the whole reason, past the columns
            return f'{"":>{width[0]}}  {"":<{width[1]}}  {r[2]}'
        shape = r[2] if len(r[2]) <= width[2] else r[2][:width[2] - 3] + '...'
        return (f'{r[0]:>{width[0]}}  {r[1]:<{width[1]}}  {shape:<{width[2]}}  {r[3]:>{width[3]}}  '
                f'{r[4]}').rstrip()
    rule = '-' * len(line(head))
    return '\n'.join([line(head), rule, *[line(r) for r in rows], rule, *notes])


def summary_html(model):
    """The summary as HTML (what a notebook shows for a ``CompiledModel``):
    the parts as a table, every text escaped, the totals below it."""
    if model.program is None:
        return f'<p>{html.escape(_exported(model))}</p>'
    head, rows, notes = _table(model)
    right = (False, False, False, True, False)       # the params column, as numbers

    def cells(tag, r):
        return ''.join(f'<{tag} style="text-align: {"right" if right[c] else "left"}">'
                       f'{html.escape(v)}</{tag}>'
                       for c, v in enumerate(r))
    return '\n'.join(['<table>', f'<thead><tr>{cells("th", head)}</tr></thead>', '<tbody>',
                      *[f'<tr>{cells("td", r)}</tr>' for r in rows], '</tbody>', '</table>',
                      '<p>' + '<br>'.join(html.escape(n) for n in notes) + '</p>'])


def _scalar_code(source):
    """How the scalar ops run, when not as statements: compiler/codegen/table.py's mark."""
    found = re.search(r'/\* the scalar op table: ([\d,]+) ops', source)
    return f'; scalar ops from an op table ({found.group(1)} ops, one C loop each way)' if found else ''


def _once(source):
    """The line saying what runs once per change of the parameters rather
    than per row (compiler/invariant.py's part, as codegen marks it)."""
    found = re.search(r'the same in every row, once: (\d+) ops forward, (\d+) backward', source)
    if not found:
        return []
    return [f'once per change of the parameters, not per row: {int(found.group(1)):,} scalar ops forward, '
            f'{int(found.group(2)):,} backward (the same in every row)']


def draw(model, path):
    """Render the program at the level of vector ops and runs of scalar ops
    to ``path`` (``.png``, ``.svg`` or ``.pdf``; needs the ``graphviz``
    package and its ``dot`` program). Returns the path written."""
    try:
        import graphviz
    except ImportError:
        raise ImportError("draw() needs graphviz: pip install graphviz "
                          "(or pip install 'micrograd-compiler[viz]'), and Graphviz's dot") from None
    if model.program is None:
        raise ValueError("draw(): a model loaded from an export has no program to draw")
    stem, ext = os.path.splitext(str(path))
    fmt = ext.lstrip('.').lower() or 'png'
    if fmt not in ('png', 'svg', 'pdf'):
        raise ValueError(f"draw(): {path} must end in .png, .svg or .pdf")
    return _digraph(graphviz, model.program, fmt).render(stem, cleanup=True)


def picture(model, fmt):
    """``draw``'s picture as ``'svg'`` text or ``'png'`` bytes, for a
    notebook; None where it cannot be drawn (no ``graphviz`` package, no
    ``dot`` program, a model loaded from an export), so that the notebook
    shows another form."""
    try:
        import graphviz
    except ImportError:
        return None
    if model.program is None:
        return None
    try:
        data = _digraph(graphviz, model.program, fmt).pipe(format=fmt)
    except (graphviz.ExecutableNotFound, graphviz.CalledProcessError, OSError):
        return None
    return data.decode('utf-8') if fmt == 'svg' else data


def _digraph(graphviz, program, fmt):
    """The ``graphviz.Digraph`` of ``program``: vector ops and runs of scalar ops."""
    dot = graphviz.Digraph(format=fmt, graph_attr={'rankdir': 'TB'},
                           node_attr={'shape': 'box', 'fontname': 'Helvetica', 'fontsize': '11'})
    owner = {}
    dot.node('inputs', f'inputs\n{program.n_inputs}', shape='ellipse')
    for s in range(program.n_inputs):
        owner[s] = 'inputs'
    for i, (kind, ops) in enumerate(parts(program)):
        name = f'part{i}'
        what, shape, params, labels = _describe(program, kind, ops)
        label = f'{what}\n{shape}' + (f'\n{len(params):,} params' if params else '')
        dot.node(name, label, style='filled', fillcolor='lightblue' if kind == 'MatVec' else 'lightgrey')
        sources = {owner[s] for op in ops for s in op.reads if s in owner} - {name}
        for src in sorted(sources):
            dot.edge(src, name)
        for op in ops:
            for o in op.writes:
                owner[o] = name
    dot.node('loss', 'loss', shape='ellipse')
    if program.loss in owner:
        dot.edge(owner[program.loss], 'loss')
    if program.outputs:
        dot.node('outputs', f'outputs\n{len(program.outputs)}', shape='ellipse')
        for src in sorted({owner[s] for s in program.outputs if s in owner}):
            dot.edge(src, 'outputs')
    return dot
