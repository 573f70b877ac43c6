"""From the rows of ``bench_mnist.py`` to conclusions: ratios, checks, tables.

``analyse`` adds the ratios (each system against PyTorch batched on the same
model at the same thread count, measured in the same run) and checks the
bits; ``text`` is the table printed by default, ``markdown`` the README's
tables (training, predict, compile time).
"""
import re

from benchmarks.bench_systems import INTERPRETER

THREAD_LABELS = ('1t', 'all')
SLOW_THREADS = 1.1   # all threads at less than this speedup over 1 thread is worth a note


def measured(r, key, field):
    """``r[key][field]`` (a timing of row ``r``), or None."""
    return r[key][field] if r.get(key) else None


def quotient(a, b):
    return a / b if a is not None and b else None


def by_model(rows):
    groups = {}
    for r in rows:
        groups.setdefault(r['model'], []).append(r)
    return groups


def reference(group, system='torch'):
    return next((r for r in group if r['system'] == system and r['status'] == 'ok'), None)


# -- ratios and checks ----------------------------------------------------------------------


def add_ratios(rows):
    """Training speedup (PyTorch batched seconds / these seconds) and predict
    speedup (these images/s / PyTorch's) at each thread setting, and each
    row's own speedup from 1 thread to all."""
    for group in by_model(rows).values():
        torch = reference(group)
        for r in group:
            r['thread_speedup'] = quotient(measured(r, 'train_1t', 's_per_epoch'),
                                           measured(r, 'train_all', 's_per_epoch'))
            if torch is None:
                continue
            for label in THREAD_LABELS:
                r[f'speedup_{label}'] = quotient(measured(torch, f'train_{label}', 's_per_epoch'),
                                                 measured(r, f'train_{label}', 's_per_epoch'))
                r[f'predict_speedup_{label}'] = quotient(measured(r, f'predict_{label}', 'images_per_s'),
                                                         measured(torch, f'predict_{label}', 'images_per_s'))


def row_problems(r, interpreter, our_weights):
    """What is wrong with an ``ok`` row: bits that differ between thread counts,
    a loss of image 0 other than the interpreter's, other initial weights."""
    problems = []
    if r['kind'] == 'compiled' and r['bits_identical'] is False:
        problems.append(f"1 thread and all threads differ after the first batch (loss "
                        f"{r['first_batch_loss_1t']!r} vs {r['first_batch_loss_all']!r}, or the "
                        f"parameters or predictions)")
    if r['kind'] == 'compiled' and interpreter and r['loss0'] != interpreter['loss0']:
        problems.append(f"loss of image 0 is {r['loss0']!r}, the interpreter's {interpreter['loss0']!r}")
    if r['kind'] == 'torch' and our_weights and r['init_params_sha256'] not in our_weights:
        problems.append('started from other initial weights than ours')
    return problems


def check(rows):
    """Fill ``loss0_minus_interpreter``; mark every row that fails a check
    ``FAILED`` with the reason, and return the reasons."""
    failures = []
    for model, group in by_model(rows).items():
        interpreter = reference(group, INTERPRETER)
        our_weights = {r['init_params_sha256'] for r in group if r['kind'] == 'compiled' and r['status'] == 'ok'}
        for r in group:
            if r['status'] != 'ok':
                continue
            if interpreter and r['loss0'] is not None:
                r['loss0_minus_interpreter'] = r['loss0'] - interpreter['loss0']
            problems = row_problems(r, interpreter, our_weights)
            if problems:
                r['status'] = 'FAILED'
                r['note'] = '; '.join(problems)
                failures.append(f"{model} {r['system']}: {r['note']}")
    return failures


def analyse(report):
    add_ratios(report['results'])
    report['failures'] = check(report['results'])
    return report['failures']


# -- formatting -----------------------------------------------------------------------------


def fmt(x, spec, empty='–'):
    return empty if x is None else format(x, spec)


def times(x, spec='.2f'):
    return fmt(x, spec) + 'x' if x is not None else '–'


def bits(r):
    return {True: 'same', False: 'DIFFER', None: '–'}[r['bits_identical']]


def passes(config):
    return f"{config['repeats']} passes" + (f" x {config['rounds']} rounds" if config['rounds'] > 1 else '')


def threads_all(report):
    return report['config']['threads']['all']


def peak(report, threads):
    """The machine's mul+add peak (GMAC/s) at ``threads`` threads for the widest
    vectors it has (bench_peak.py), or None."""
    peaks = report['machine'].get('peaks') or {}
    for name in ('avx512 mul+add', 'avx2 mul+add'):
        if name in peaks:
            by_t = {int(t): v for t, v in peaks[name].items()}
            return by_t.get(threads)
    return None


def peak_lines(report):
    m = report['machine']
    peaks = m.get('peaks') or {}
    if not peaks:
        return ['peaks: not measured (no C compiler or not x86-64)']
    return [f"peaks on {m['cpu']} (benchmarks/peak.c, GMAC/s; mul+add is what exact kernels may do): "
            + '; '.join(f"{name} " + ' / '.join(f'{t}T {v:.1f}' for t, v in sorted(by_t.items(), key=lambda x: int(x[0])))
                        for name, by_t in peaks.items())]


def work(r, label):
    """``(executed GMAC/s, dense-equivalent GMAC/s)`` of a training row at a
    thread setting, or Nones."""
    t = measured(r, f'train_{label}', 's_per_epoch')
    ex, dense = r.get('macs_executed'), r.get('macs_dense')
    if not t or not ex or not dense:
        return None, None
    per_s = 60000 / t
    return sum(ex.values()) * per_s / 1e9, sum(dense.values()) * per_s / 1e9


def work_table(report, markdown_style):
    """Per compiled row: the multiply-adds of a training image (executed after
    skipping, and dense), GMAC/s at 1 and all threads and their share of the
    mul+add peak."""
    n_all = threads_all(report)
    headers = ['model', 'system', 'MACs/image run', 'dense', 'run/dense',
               'GMAC/s 1T', '% peak 1T', 'dense-eq GMAC/s 1T',
               'GMAC/s all', '% peak all', 'dense-eq GMAC/s all']
    lines = []
    for r in report['results']:
        if r.get('kind') != 'compiled' or r['status'] != 'ok' or not r.get('macs_dense'):
            continue
        ex = sum((r.get('macs_executed') or {}).values()) or None
        dense = sum(r['macs_dense'].values())
        cells = [r['model'], r['system'], fmt(ex, ',.0f'), fmt(dense, ',.0f'), fmt(quotient(ex, dense), '.2f')]
        for label, n in (('1t', 1), ('all', n_all)):
            g, gd = work(r, label)
            cells += [fmt(g, '.1f'), fmt(quotient(g, peak(report, n)) and 100 * quotient(g, peak(report, n)), '.0f'),
                      fmt(gd, '.1f')]
        lines.append(cells)
    if markdown_style:
        return markdown_table(headers, lines)
    return aligned(headers, lines, [False, False] + [True] * (len(headers) - 2))


def header(report):
    m, c = report['machine'], report['config']
    versions = ', '.join(f'{k} {v}' for k, v in m['compilers'].items() if v) or 'none'
    return peak_lines(report) + [
        f"machine: {m['cpu']} ({', '.join(m['cpu_flags']) or 'no AVX'}), {m['cores']} cores "
        f"({m['cores_usable']} usable), {m['mem_gb']} GB, load {m['loadavg'][0]}",
        f"python {m['python']}, numpy {m['numpy']}, torch {m['torch'] or 'not installed'}, "
        f"compilers: {versions}; git {m['git']}",
        f"data: {c['data']}, {c['images']:,} images, batch {c['batch']}, lr {c['lr']}, float64; "
        f"median of {passes(c)} per setting; all threads = {threads_all(report)}"
        + (' (quick)' if c['quick'] else ''),
    ]


def aligned(headers, lines, right):
    """A plain-text table: ``right`` says which columns are right-aligned."""
    widths = [max(len(x) for x in column) for column in zip(headers, *lines)]

    def line(cells):
        return '  '.join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right)).rstrip()
    rule = '-' * len(line(['-' * w for w in widths]))
    return [line(headers), rule] + [line(cells) for cells in lines]


# (header, right-aligned, cell of a row)
TEXT_COLUMNS = (
    ('model', False, lambda r: r['model']),
    ('system', False, lambda r: r['system']),
    ('status', False, lambda r: r['status']),
    ('compile s', True, lambda r: fmt(r.get('compile_s'), '.2f')),
    ('s/epoch 1T', True, lambda r: fmt(measured(r, 'train_1t', 's_per_epoch'), ',.3f')),
    ('s/epoch all', True, lambda r: fmt(measured(r, 'train_all', 's_per_epoch'), ',.3f')),
    ('all/1T', True, lambda r: times(r['thread_speedup'])),
    ('vs torch 1T', True, lambda r: times(r['speedup_1t'], '.3g')),
    ('vs torch all', True, lambda r: times(r['speedup_all'], '.3g')),
    ('predict/s 1T', True, lambda r: fmt(measured(r, 'predict_1t', 'images_per_s'), ',.0f')),
    ('predict/s all', True, lambda r: fmt(measured(r, 'predict_all', 'images_per_s'), ',.0f')),
    ('vs torch 1T', True, lambda r: times(r['predict_speedup_1t'], '.3g')),
    ('vs torch all', True, lambda r: times(r['predict_speedup_all'], '.3g')),
    ('loss0 - interp', True, lambda r: fmt(r['loss0_minus_interpreter'], '.2g')),
    ('1T/all bits', False, bits),
    ('others', True, lambda r: fmt(r['other_load'], '.2f')),
)


def notes(report):
    out = [f"  {r['model']} {r['system']}: {r['note']}" for r in report['results'] if r['note']]
    if threads_all(report) > 1:
        out += [f"  {r['model']} {r['system']}: all threads only {r['thread_speedup']:.2f}x 1 thread; "
                f"other work kept {fmt(r['other_load'], '.2f')} CPUs busy meanwhile (rerun if high)"
                for r in report['results'] if r['thread_speedup'] and r['thread_speedup'] < SLOW_THREADS]
    return out


def text(report):
    lines = header(report) + ['']
    lines += aligned([h for h, _, _ in TEXT_COLUMNS],
                     [[cell(r) for _, _, cell in TEXT_COLUMNS] for r in report['results']],
                     [right for _, right, _ in TEXT_COLUMNS])
    lines += ['', 'kernel work (training; MACs: multiply-adds; % peak: executed GMAC/s over the mul+add peak '
              'at the same thread count):', ''] + work_table(report, False)
    found = notes(report)
    if found:
        lines += ['', 'notes:'] + found
    lines += ['', "s/epoch: seconds per 60,000 images, extrapolated; vs torch: against PyTorch batched "
              "(its seconds / ours in training, our images/s / its in predict) at the same thread count;",
              "loss0: loss of image 0 at the initial weights; 1T/all bits: the first batch gives the same "
              "loss, parameters and predictions at 1 thread and at all threads;",
              "others: CPUs kept busy by other processes (or the hypervisor) while the row was timed."]
    failures = report.get('failures')
    lines.append('checks: ' + ('FAILED:\n  ' + '\n  '.join(failures) if failures else 'all passed'))
    return '\n'.join(lines)


# -- the README's tables ----------------------------------------------------------------------


def markdown_table(headers, lines):
    out = ['| ' + ' | '.join(headers) + ' |', '|---|' + '---:|' * (len(headers) - 1)]
    return out + ['| ' + ' | '.join(cells) + ' |' for cells in lines]


def builds(report):
    """The compiled systems that ran, in the order asked for."""
    ran = {r['system'] for r in report['results'] if r['kind'] == 'compiled'}
    return [b for b in report['config']['builds'] if b in ran]


def system_row(group, system):
    return next((r for r in group if r['system'] == system), None) or {}


def per_thread_table(report, key, field, spec, speedup):
    """Model by model: PyTorch and each build at 1 thread and all threads
    (``r[key_1t][field]``), then each build's speedups at equal threads."""
    names = builds(report)
    headers = (['model', 'PyTorch 1T', 'PyTorch all']
               + [f'ours {b} {t}' for b in names for t in ('1T', 'all')]
               + ['ratio 1T', 'ratio all'])
    lines = []
    for model, group in by_model(report['results']).items():
        systems = [system_row(group, s) for s in ['torch', *names]]
        cells = [fmt(measured(r, f'{key}_{t}', field), spec) for r in systems for t in THREAD_LABELS]
        ratios = [' / '.join(times(r.get(f'{speedup}_{t}')) for r in systems[1:]) for t in THREAD_LABELS]
        lines.append([model, *cells, *ratios])
    return markdown_table(headers, lines)


def compile_table(report):
    names = builds(report)
    headers = ['model', f'C lines ({names[0]})' if names else 'C lines'] + [f'ours {b}: {h}' for b in names for h in ('compile() s', 'C compiler s')]
    lines = []
    for model, group in by_model(report['results']).items():
        rows = [system_row(group, b) for b in names]
        c_lines = next((r['c_lines'] for r in rows if r.get('c_lines')), None)
        cells = [fmt(x, '.2f') for r in rows for x in (r.get('compile_s'), (r.get('timings') or {}).get('compile'))]
        lines.append([model, fmt(c_lines, ','), *cells])
    return markdown_table(headers, lines)


def short_version(version):
    """``'Debian clang version 14.0.6'`` -> ``'14.0.6'`` (the last dotted number)."""
    found = re.findall(r'\d+(?:\.\d+)+', version)
    return found[-1] if found else version


def markdown(report):
    c, m = report['config'], report['machine']
    names = ' / '.join(builds(report))
    versions = ', '.join(f'{k} {short_version(v)}' for k, v in m['compilers'].items() if v)
    caption = (f"{c['data']}, {c['images']:,} images, batch {c['batch']}, float64, median of "
               f"{passes(c)}; all = {threads_all(report)} threads; "
               f"{m['cpu']}, {versions}, PyTorch {m['torch']}; git {m['git']}.")
    out = [f"Training, seconds per 60,000-image epoch (ratio: PyTorch's seconds / ours at the same "
           f"thread count, {names}). {caption}", '']
    out += per_thread_table(report, 'train', 's_per_epoch', '.2f', 'speedup')
    out += ['', f"Predict, images per second (ratio: ours / PyTorch in `no_grad`, {names}).", '']
    out += per_thread_table(report, 'predict', 'images_per_s', ',.0f', 'predict_speedup')
    out += ['', f"Kernel work in training: multiply-adds per image run by the loop kernels (after skipping "
            f"zeros) and dense, GMAC/s and share of the mul+add peak. " + ' '.join(peak_lines(report)), '']
    out += work_table(report, True)
    out += ['', "`compile()` seconds, end to end (trace, pass, C, build, load; no cache), "
            "and the C compiler's part.", '']
    out += compile_table(report)
    return '\n'.join(out)
