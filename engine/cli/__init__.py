"""``volsynth``: the engine's command line.

Each sub-command lives in its own module with ``register(subparsers)``, which adds a parser whose
``func(args) -> int`` runs it. Modules are imported lazily-ish: only argparse wiring happens at start-up;
heavy imports (torch, monai) happen inside ``func``, so ``volsynth --help`` is instant.

Errors from the engine are printed as one line (``volsynth: error: ...``) and turned into the error's
exit code; a traceback is shown only with ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

# Sub-command modules, in the order ``--help`` lists them.
_COMMAND_MODULES = (
    "engine.cli.info",
    "engine.cli.models",
    "engine.cli.generate",
    "engine.cli.training",
    "engine.cli.bench",
    "engine.cli.tune",
    "engine.cli.compare",
    "engine.cli.quality",
    "engine.cli.segment",
    "engine.cli.cohort",
    "engine.cli.monitor",
    "engine.cli.vault",
    "engine.cli.serve",
    "engine.cli.plan",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="volsynth",
        description="VolSynth engine: synthesize 3D MRI volumes with diffusion models.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that command is not part of this build
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from engine.errors import EngineError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except EngineError as exc:
        if args.debug:
            raise
        from engine.formatting import terminal_safe

        # a message may quote a hub, a catalogue or a file: no escape sequence of theirs reaches the terminal
        print(f"volsynth: error: {terminal_safe(str(exc), newlines=False)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("volsynth: cancelled", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of our output went away (`volsynth vault ls --json | head`): stop quietly, as
        # command-line tools do. Python would otherwise print a traceback, and another one when it flushes
        # stdout at exit, so stdout is pointed at /dev/null first.
        import os

        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by a closed pipe


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
