"""What every `dualjax` subcommand's parser shares: `--log-level`, `--quiet`, the output flags, and
subcommands whose flags are loaded only when they run.

The output flags mean the same everywhere: `--out DIR` a directory of run outputs (docs/report.md),
`--json FILE` the command's one JSON object, `--plot FILE` its figure (PNG). Nothing else is written,
but for `dualjax calibrate`'s product, the `local` profile in the per-user home (`dualjax.core.paths`).
`--quiet` (every command that shows progress) drops the progress (bars, per-step lines on stderr, a
benchmark's INFO lines) and keeps the results, on stdout.

A lazy subcommand (`add_lazy`) is listed by its parent's --help with its one-line help; its module,
which may import JAX, is imported and its flags added only when that subcommand is on the command
line. Such a module has `add_arguments(parser)` and `main(argv=None, args=None)`, which parses `argv`
itself when run alone and takes the `dualjax` parser's `args` otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import logging

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def common() -> argparse.ArgumentParser:
    """The parent parser of every subcommand: --log-level, settable before or after the subcommand."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--log-level", choices=LOG_LEVELS, type=str.upper, default=argparse.SUPPRESS,
                   help="level of dualjax's log messages on stderr (default: WARNING; progress of long runs "
                   "at INFO where a command shows it)")
    return p


def set_log_level(level: str | None, quiet: bool = False) -> None:
    """dualjax's loggers at `level` (None: WARNING unless a command turns on its own progress, which
    `quiet` keeps off: WARNING)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", force=True)
    logging.getLogger("dualjax").setLevel(level or ("WARNING" if quiet else logging.NOTSET))


def quiet_flag(p: argparse.ArgumentParser) -> None:
    """--quiet: no progress (the command's results are printed as without it)."""
    p.add_argument("--quiet", action="store_true", help="no progress (bars, per-step lines); the results are "
                   "printed as without it")


def add_lazy(sub, name: str, module: str, help: str, load: bool, extra=None) -> argparse.ArgumentParser:
    """Subcommand `name` of `module` (`add_arguments`, `main`); its flags are added only when `load`
    (it is the command being run), after `extra(parser)` (flags its group shares)."""
    p = sub.add_parser(name, help=help, description=help, parents=[common()])
    if load:
        mod = importlib.import_module(module)
        if mod.__doc__:
            p.description = mod.__doc__
            p.formatter_class = argparse.RawDescriptionHelpFormatter
        if extra is not None:
            extra(p)
        mod.add_arguments(p)
        p.set_defaults(func=lambda args: _returned(mod.main(args=args)))
    return p


def _returned(result) -> int:
    """A command's exit code from what its `main` returned (a benchmark returns its JSON object)."""
    return result if isinstance(result, int) else 0


def changed(namespace: argparse.Namespace, actions) -> list[str]:
    """The flags among `actions` whose value in `namespace` is not their default: given, and changing
    something (one given at its default value changes nothing, ignored or not)."""
    return ["/".join(a.option_strings) for a in actions if a.option_strings and a.default is not argparse.SUPPRESS
            and getattr(namespace, a.dest, a.default) != a.default]


class OwnFlagsAfter(argparse._SubParsersAction):
    """Subcommands that take their own flags after their name: the parent's flags given before it,
    which the subcommand would ignore, are refused (`add_subparsers(action=OwnFlagsAfter)`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if given := changed(namespace, [a for a in parser._actions if a is not self]):
            parser.error(f"{', '.join(given)} before `{values[0]}`: flags of `{parser.prog}` itself, which "
                         f"`{parser.prog} {values[0]}` ignores (give its flags after `{values[0]}`)")
        super().__call__(parser, namespace, values, option_string)


def out_flag(p: argparse.ArgumentParser, default: str | None, what: str) -> None:
    """--out DIR: where the command's run outputs go (`what`); none when `default` is None and no --out."""
    from dualjax.outputs import output_dir
    shown = f"default {default}" if default else "nothing is written without it"
    p.add_argument("--out", metavar="DIR", default=default, type=output_dir, help=f"{what} ({shown})")


def json_flag(p: argparse.ArgumentParser, what: str = "the command's result") -> None:
    from dualjax.outputs import output_file
    p.add_argument("--json", metavar="FILE", type=output_file, help=f"write {what} as one JSON object to FILE")


def plot_flag(p: argparse.ArgumentParser, what: str) -> None:
    from dualjax.outputs import output_file
    p.add_argument("--plot", metavar="FILE", type=output_file, help=f"draw {what} to FILE (PNG)")
