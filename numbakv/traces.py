"""Mooncake-format request traces: one JSON object per line with the prompt's chain of block ids."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and, for a bad line, its number."""


@dataclass(frozen=True)
class TraceRequest:
    """One request: arrival (ms), token counts, and its prompt as a chain of block ids."""

    timestamp: int
    input_length: int
    output_length: int
    hash_ids: list[int]


def read_hash_chains(path: str | Path) -> list[list[int]]:
    """Each request's `hash_ids`, in file order; everything else in a line is left unchecked."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: cannot read trace: {error}") from None
    chains = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            chains.append(_parse_chain(line, f"{path}:{number}"))
    if not chains:
        raise TraceError(f"{path}: trace has no requests")
    return chains


def _parse_chain(line: str, where: str) -> list[int]:
    try:
        request = json.loads(line)
    except json.JSONDecodeError as error:
        raise TraceError(f"{where}: not valid JSON ({error.msg})") from None
    if not isinstance(request, dict) or "hash_ids" not in request:
        raise TraceError(f"{where}: expected a JSON object with a 'hash_ids' list")
    chain = request["hash_ids"]
    if not isinstance(chain, list) or not all(
        isinstance(block, int) and not isinstance(block, bool) for block in chain
    ):
        raise TraceError(f"{where}: 'hash_ids' must be a list of integers")
    return chain


def write_trace(path: str | Path, requests: Iterable[TraceRequest]) -> None:
    """Write requests as a Mooncake-format jsonl file."""
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(json.dumps(asdict(request)) + "\n" for request in requests)
