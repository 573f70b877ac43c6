"""``python -m compiler``: the compiler's command line.

    python -m compiler cache --info    the build cache: folder, entries, total size, size cap
    python -m compiler cache --clear   remove every build from it (downloads in it are kept)
    python -m compiler export FILE.py:FUNC -o DIR
                                       compile the graph FUNC() returns, export it to DIR

Each subcommand is a pair of functions, one adding its parser and one
running it, listed in ``COMMANDS``.
"""
import argparse
import importlib.util
import inspect
import os
import signal
import sys

from compiler.build import BuildError
from compiler.build.cache import (cache_chosen, cache_disabled, cache_entries, cache_max, cache_root, clear_cache,
                                  format_size)


def add_cache(subparsers):
    p = subparsers.add_parser('cache', help='show or empty the build cache',
                              description='Show or empty the build cache: $MICROGRAD_CACHE_DIR, '
                                          'else ~/.cache/micrograd-compiler; its size cap is '
                                          '$MICROGRAD_CACHE_MAX (500M, 2G...; default 1G).')
    action = p.add_mutually_exclusive_group()
    action.add_argument('--info', action='store_true',
                        help='print the folder, its entries, their total size and the cap (the default)')
    action.add_argument('--clear', action='store_true',
                        help='remove every build (shared objects, checksums, kept sources); '
                             'builds running now are left alone')
    p.set_defaults(run=run_cache)


def run_cache(args):
    root = cache_root()
    if args.clear:
        if not os.path.isdir(root):
            print(f"{root}: no build cache here, nothing to remove")
            return 0
        removed, freed, busy = clear_cache(root)
        print(f"{root}: removed {removed} entr{'y' if removed == 1 else 'ies'} ({format_size(freed)})"
              + (f"; {busy} being built now left in place" if busy else ''))
        return 0
    entries = cache_entries(root)
    built = sum(e.built for e in entries)
    where = ' ($MICROGRAD_CACHE_DIR)' if cache_chosen() else ''
    state = ''
    if cache_disabled():
        state = ' (disabled by $MICROGRAD_CACHE: builds go to temporary folders)'
    elif not os.path.isdir(root):
        state = ' (not created yet)'
    cap = cache_max()
    print(f"folder:  {root}{where}{state}")
    print(f"entries: {len(entries)} ({built} built, {len(entries) - built} failed builds' sources)")
    print(f"size:    {format_size(sum(e.size for e in entries))}")
    print(f"cap:     {format_size(cap)}"
          + (" ($MICROGRAD_CACHE_MAX)" if os.environ.get('MICROGRAD_CACHE_MAX', '').strip() else
             " (default; set $MICROGRAD_CACHE_MAX, e.g. 500M or 2G)"))
    return 0


class CommandError(Exception):
    """A mistake in the command's arguments or in what they name: one line, exit status 1."""


def add_export(subparsers):
    p = subparsers.add_parser(
        'export', help='compile a graph from a Python file and export it',
        description='Run FUNC() from FILE.py, compile the graph it returns and export it to DIR: '
                    'nn.c, nn.h, nn.abi3.so and nn.json, so that `sys.path.insert(0, DIR); import nn` '
                    'works in any Python of this version, without micrograd or compiler.',
        epilog='FUNC() returns (loss, inputs, params, outputs) or a dict with those keys (outputs '
               'may be left out; a dict may also give optimizer, constants and input_grads).')
    p.add_argument('target', metavar='FILE.py:FUNC', help='the file and the function that builds the graph')
    p.add_argument('-o', '--output', metavar='DIR', required=True, help='the folder to export to')
    p.add_argument('--cc', metavar='CC', help='the C compiler (default: chosen by size)')
    p.set_defaults(run=run_export)


def _one_line(error):
    """``TypeName: message`` on one line."""
    message = ' '.join(str(error).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


GRAPH_KEYS = ('loss', 'inputs', 'params', 'outputs')
OPTIONAL_KEYS = ('optimizer', 'constants', 'input_grads')


def load_graph(target):
    """``FUNC()`` of ``FILE.py:FUNC``, as the keyword arguments of ``compile``."""
    path, sep, name = target.rpartition(':')
    if not sep or not path or not name.isidentifier():
        raise CommandError(f"{target!r}: expected FILE.py:FUNC, e.g. model.py:build")
    if os.path.isdir(path):
        raise CommandError(f"{path} is a folder: give the Python file that defines {name}, e.g. {path}/model.py:{name}")
    if not os.path.isfile(path):
        raise CommandError(f"{path}: no such file")
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))   # its own imports, as `python FILE.py`
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 -- the user's file: whatever it raises, one line
        raise CommandError(f"{path} failed to run: {_one_line(e)}") from None
    finally:
        sys.path.pop(0)
    func = getattr(module, name, None)
    if not callable(func):
        raise CommandError(f"{path} has no function {name}")
    try:
        inspect.signature(func).bind()
    except TypeError:
        raise CommandError(f"{name}{inspect.signature(func)} needs arguments: FUNC is called with none") from None
    except ValueError:      # no signature to read (a builtin): call it and see
        pass
    try:
        got = func()
    except Exception as e:  # noqa: BLE001
        raise CommandError(f"{name}() raised {_one_line(e)}") from None
    if isinstance(got, dict):
        unknown = set(got) - set(GRAPH_KEYS) - set(OPTIONAL_KEYS)
        if unknown or 'loss' not in got:
            raise CommandError(f"{name}() returned a dict with keys {sorted(got)}: expected "
                               f"{', '.join(GRAPH_KEYS)} (and optionally {', '.join(OPTIONAL_KEYS)})")
        return dict(got)
    if isinstance(got, (tuple, list)) and len(got) in (3, 4):
        return dict(zip(GRAPH_KEYS, got))
    raise CommandError(f"{name}() returned {type(got).__name__}: expected (loss, inputs, params, outputs) "
                       f"or a dict with those keys")


def run_export(args):
    import compiler
    graph = load_graph(args.target)
    try:
        m = compiler.compile(graph.pop('loss'), cc=args.cc, **graph)
        m.export(args.output)
    except (TypeError, ValueError) as e:    # a graph compile() refuses (TraceError), bad arguments
        raise CommandError(f"{args.target}: {e}") from None
    sizes = ', '.join(f"{name} {format_size(os.path.getsize(os.path.join(args.output, name)))}"
                      for name in sorted(os.listdir(args.output)))
    print(f"exported {m.n_inputs} inputs, {m.n_params} params, {m.n_outputs} outputs to "
          f"{args.output}: {sizes}")
    return 0


COMMANDS = (add_cache, add_export)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m compiler',
                                     description="micrograd-compiler's command line")
    subparsers = parser.add_subparsers(metavar='COMMAND', required=True)
    for add in COMMANDS:
        add(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (BuildError, OSError, CommandError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:   # Ctrl-C: a line, not a traceback; 128 + SIGINT as a shell expects
        print("\ninterrupted", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == '__main__':
    sys.exit(main())
