"""`python3 -m numbakv.workloads`: write a seeded synthetic workload as a Mooncake-format trace.

python3 -m numbakv.workloads --kind mixed|documents|chat|loop [--seed N] --out FILE.jsonl [--json]
"""

from __future__ import annotations

import sys

from numbakv.tools.cli import INTERRUPTED, Parser, non_negative_int, output_file, print_json
from numbakv.tools.traces import write_trace
from numbakv.tools.workloads.core import WORKLOADS

KINDS = {
    "chat": "multi-turn chat sessions on a few system prompts (recency is all there is)",
    "mixed": "sessions, questions about shared documents and one-off long prompts",
    "documents": "mostly questions over a large document library (RAG-like)",
    "loop": "a batch job sweeping a fixed document set again and again",
}


def _parser() -> Parser:
    parser = Parser(
        prog="numbakv-workloads",
        description="Write a seeded synthetic workload as a Mooncake-format jsonl trace. Kinds: "
        + "; ".join(f"{kind}: {about}" for kind, about in KINDS.items())
        + ".",
    )
    parser.add_argument(
        "--kind", choices=list(WORKLOADS), default="mixed", help="workload (default: %(default)s)"
    )
    parser.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="random seed, a whole number >= 0; the same seed writes the same file "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        required=True,
        type=output_file,
        metavar="FILE",
        help="jsonl file to write (required)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print a JSON summary on stdout, the human-readable line on stderr "
        "(default: the line on stdout)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """The workload CLI: write one seeded workload to a jsonl file."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        requests = WORKLOADS[args.kind](seed=args.seed)
        write_trace(args.out, requests)
    except KeyboardInterrupt:
        sys.stderr.write(f"{parser.prog}: interrupted; {args.out} was not written\n")
        return INTERRUPTED
    references = sum(len(request.hash_ids) for request in requests)
    distinct = len({block for request in requests for block in request.hash_ids})
    print(
        f"{args.out}: {len(requests):,} requests, {references:,} block references, "
        f"{distinct:,} distinct",
        file=sys.stderr if args.json else sys.stdout,
    )
    if args.json:
        print_json(
            {
                "out": args.out,
                "kind": args.kind,
                "seed": args.seed,
                "requests": len(requests),
                "references": references,
                "distinct_blocks": distinct,
            }
        )
    return 0
