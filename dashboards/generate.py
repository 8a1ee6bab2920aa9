"""Write the numbakv Grafana dashboard's JSON, generated from code (``dashboards/board.py``).

    python -m numbakv.dashboards.generate [--out FILE]        # or: numbakv-dashboards [--out FILE]

Without --out the JSON goes to stdout. The copy Grafana provisions from, ``dashboards/numbakv.json``
(``OUTPUT``), is committed; after changing a panel regenerate it with
``python -m numbakv.dashboards.generate --out dashboards/numbakv.json`` (a test fails while it is stale).
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence

from numbakv.tools.cli import Parser, missing_extra, output_file

OUTPUT = pathlib.Path(__file__).with_name("numbakv.json")


def expressions(dashboard_json: dict) -> list[str]:
    """Every PromQL expression of a dashboard's panels."""
    return [
        t["expr"] for p in dashboard_json["panels"] for t in p.get("targets", []) if "expr" in t
    ]


def _parser() -> Parser:
    parser = Parser(
        prog="numbakv-dashboards",
        description="Write the numbakv Grafana dashboard (JSON, for Grafana's provisioning or "
        "its import dialog), generated from code.",
    )
    parser.add_argument(
        "--out",
        type=output_file,
        metavar="FILE",
        help=f"file to write (default: stdout; the committed copy is {OUTPUT.parent.name}/"
        f"{OUTPUT.name})",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        from numbakv.dashboards.board import render
    except ImportError:
        missing_extra(parser.prog, "generating the dashboard", "dashboards")
    text = render()
    if args.out is None:
        sys.stdout.write(text)
        return 0
    pathlib.Path(args.out).write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
