"""``python -m compiler``: the compiler's command line.

    python -m compiler cache --info    the build cache: folder, entries, total size, size cap
    python -m compiler cache --clear   remove every build from it (downloads in it are kept)

Each subcommand is a pair of functions, one adding its parser and one
running it, listed in ``COMMANDS``; a new one (``export``) is added there.
"""
import argparse
import os
import sys

from compiler.build import BuildError, cache_chosen, cache_disabled, cache_max
from compiler.files import cache_entries, cache_root, clear_cache, format_size


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


COMMANDS = (add_cache,)


def main(argv=None):
    parser = argparse.ArgumentParser(prog='python -m compiler',
                                     description="micrograd-compiler's command line")
    subparsers = parser.add_subparsers(metavar='COMMAND', required=True)
    for add in COMMANDS:
        add(subparsers)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (BuildError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
