"""The `accelbench` command line: run a trial or a suite, write a report, list what is registered, open the MLflow UI.

One module per group of subcommands (`trials`: run, suite, lambada; `sweeps`: sweep, worker, studies, dashboard;
`store`: report, doctor, list, ui; `zoo`: zoo build); the options they share are declared once in `options`.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback

from cli import store, sweeps, trials, zoo
from core.errors import UserError, WriteFailed


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line, like every other bad input (argparse prints the whole usage first)."""
        self.exit(2, f"accelbench: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="accelbench", description=__doc__.splitlines()[0])
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = p.add_subparsers(dest="command", required=True)
    for module in (trials, sweeps, store, zoo):
        module.register(sub)
    return p


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so it unwinds like Ctrl-C: runs end KILLED, temp files are removed."""


def _terminate(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may reach a hub; fail at once instead of retrying
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as typed (a cost entry names it)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return args.func(args)
    except UserError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"accelbench: error: {exc}", file=sys.stderr)
        return 2
    except WriteFailed as exc:
        # 1, not 2: the request was sound, and work had started when a disk filled or a store turned read-only; what
        # the trial drew stays spooled, and the same command resumes from it once the space (or access) is back
        if args.debug:
            traceback.print_exc()
        print(f"accelbench: {exc}", file=sys.stderr)
        return 1
    except Terminated:
        print("accelbench: terminated", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("accelbench: interrupted", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
