"""What numbakv's commands share: one-line errors, argument types, missing extras, Ctrl-C.

Every command checks all its arguments before it starts work and answers bad input with one line
on stderr, `PROG: error: argument --FLAG: got 'VALUE', expected WHAT`, and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

if TYPE_CHECKING:
    from numbakv.tools.fleet.core import FleetResult
    from numbakv.tools.replay.core import ReplayResult

INTERRUPTED = 130  # the shell's status for a process ended by Ctrl-C (128 + SIGINT)
MISSING_EXTRA = 2  # like bad input: the command cannot start as asked; the pip line says why


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (argparse would print the usage block too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")

    def bad(self, flag: str, got: object, expected: str) -> NoReturn:
        """Reject an argument found wrong after parsing (in combination with others, say)."""
        self.error(f"argument {flag}: got {str(got)!r}, expected {expected}")


def _whole(text: str, lowest: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected {expected}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"got {text!r}, expected {expected}")
    return value


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    return _whole(text, 1, "a whole number >= 1")


def non_negative_int(text: str) -> int:
    """argparse type: a whole number >= 0."""
    return _whole(text, 0, "a whole number >= 0")


def output_file(text: str) -> str:
    """argparse type: a file that can be written (its directory exists; it is not a directory,
    nor a device or a pipe, which a file written whole then renamed into place would replace)."""
    path = Path(text)
    directory = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"got {text!r}, expected a file name, not a directory")
    if path.exists() and not path.is_file():
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected a regular file's name, not a device or a pipe"
        )
    if not directory.is_dir():
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected a file in an existing directory ({directory} is not one)"
        )
    try:  # only making a file there says whether one can be (root passes os.access everywhere)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=f".{path.name}.", suffix=".check"):
            pass
        if path.exists():
            with path.open("ab"):
                pass
    except OSError as error:
        raise argparse.ArgumentTypeError(
            f"got {text!r}, expected a file this user can write ({error.strerror})"
        ) from None
    return text


def install_hint(extra: str) -> str:
    """How to install an extra: numbakv is installed from its repository, not the package index."""
    return f"pip install -e '.[{extra}]' in numbakv's repository"


def missing_extra(prog: str, feature: str, extra: str) -> NoReturn:
    """Exit with one line naming the pip command that installs what `feature` needs."""
    sys.stderr.write(f"{prog}: error: {feature} needs the '{extra}' extra: {install_hint(extra)}\n")
    raise SystemExit(MISSING_EXTRA)


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while a tool works; still a KeyboardInterrupt. `results` holds the runs finished
    and, last, the one cut short (its own count of requests says how far it got); `requests` is
    how many requests a whole run serves."""

    def __init__(self, results: list, requests: int) -> None:
        super().__init__()
        self.results = results
        self.requests = requests


@contextmanager
def runs_kept(results: list, requests: int) -> Iterator[None]:
    """Ctrl-C inside raises `Interrupted` with `results` (the runs finished so far), followed by
    the run cut short when the interruption carried one."""
    try:
        yield
    except Interrupted as cut_short:
        raise Interrupted(results + cut_short.results, requests) from None
    except KeyboardInterrupt:  # between two runs
        raise Interrupted(results, requests) from None


@contextmanager
def interrupts_between_requests() -> Iterator[Callable[[], None]]:
    """Meanwhile a first Ctrl-C is only noted, and the function yielded, called before each
    request, raises it (KeyboardInterrupt): the loop of requests stops before its next one, so
    partial figures count whole requests (after the last one, leaving raises it). Raised where it
    lands, Ctrl-C could land in a weakref callback or a finalizer, where Python prints a traceback
    and drops it. A second one is raised where it lands, as before, to stop a request that takes
    too long. Off the main thread, which receives no signal, or where Ctrl-C is ignored, nothing
    changes."""
    before = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or before in (
        signal.SIG_IGN,
        None,  # a handler set outside Python: left alone
    ):
        yield lambda: None
        return
    noted = threading.Event()

    def stop_if_noted() -> None:
        if noted.is_set():
            raise KeyboardInterrupt

    def note(*_: Any) -> None:
        noted.set()
        signal.signal(signal.SIGINT, before)

    signal.signal(signal.SIGINT, note)
    try:
        yield stop_if_noted
    finally:
        signal.signal(signal.SIGINT, before)
    stop_if_noted()


def interrupted(prog: str, what: str) -> int:
    """The one line Ctrl-C ends a command with; returns the exit status to end with."""
    sys.stderr.write(f"{prog}: interrupted {what}\n")
    return INTERRUPTED


def print_json(document: Any) -> None:
    """The machine-readable result: one JSON document, alone on stdout."""
    json.dump(document, sys.stdout)
    sys.stdout.write("\n")


def print_runs_json(runs: list[dict], source: str, interrupted: bool, single: bool) -> None:
    """A replay's JSON: the one run with its trace beside it, or every run under `runs`."""
    common = {"trace": source, "interrupted": interrupted}
    print_json({**runs[0], **common} if single else {**common, "runs": runs})


def print_hit_ratio(result: ReplayResult | FleetResult, requests: int, out: TextIO) -> None:
    """The hit-ratio line of a report, saying so when the replay stopped before `requests`."""
    partial = (
        f"; partial: stopped after {result.requests:,} of {requests:,} requests"
        if result.requests < requests
        else ""
    )
    print(
        f"hit ratio       {result.hit_ratio:.4f}  "
        f"({result.hits:,} of {result.references:,} block references{partial})",
        file=out,
    )


def comma_list(parser: Parser, flag: str, text: str) -> list[str]:
    """The items of a comma-separated option, stripped, each once, in their order; exits on an
    empty item (`10,,20`, a trailing comma), which is a typo more often than not."""
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        parser.bad(flag, text, "items separated by single commas, none of them empty")
    return list(dict.fromkeys(items))
