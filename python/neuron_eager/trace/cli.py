"""neuron-trace: look at neuron-eager trace files.

    neuron-trace summary run.ntrace               text tables: top ops, segments, syncs
    neuron-trace summary run.ntrace --json        the same summaries as JSON data
    neuron-trace perfetto run.ntrace -o run.json  Chrome Trace JSON for ui.perfetto.dev
    neuron-trace html run.ntrace -o run.html      one self-contained HTML report
    neuron-trace diff a.ntrace b.ntrace           what changed between two traces
    neuron-trace replay run.ntrace --policy P     a policy's decisions and predicted time
    neuron-trace replay run.ntrace --compare default aggressive never
    neuron-trace replay run.ntrace --sweep hot_threshold=1,3,10 -o out/sweep
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import List, Optional

from .format import TraceFormatError, load


def _add_trace(p: argparse.ArgumentParser, name: str = "trace", help: str = "trace file"):
    p.add_argument(name, help=help)


def _add_incomplete(p: argparse.ArgumentParser):
    p.add_argument("--allow-incomplete", action="store_true",
                   help="read a trace that was not closed (recording still running or the "
                        "process died) up to its last whole chunk instead of failing")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="neuron-trace", description="Summaries, Perfetto JSON, HTML reports and diffs "
        "of neuron-eager trace files (format: docs/trace-format.md).",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("summary", help="print the summary tables of a trace",
                       description="Top ops (calls, host and device time), segments (with a "
                       "like-with-like speedup per key), the online guard's verdicts, syncs by "
                       "cause, fallbacks, counters and totals of a trace.")
    _add_trace(p)
    p.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON data")
    _add_incomplete(p)

    p = sub.add_parser("perfetto", help="write Chrome Trace Event JSON (ui.perfetto.dev)",
                       description="Writes the trace as Chrome Trace Event JSON: a track per "
                       "host thread, stream worker and the compiler, flow arrows from each "
                       "op's dispatch to its execution, memory and queue-depth counters.")
    _add_trace(p)
    p.add_argument("-o", "--output", required=True, help="the JSON file to write")
    _add_incomplete(p)

    p = sub.add_parser("html", help="write a self-contained HTML report",
                       description="Writes one HTML file (no network needed) with a zoomable "
                       "timeline and the summary tables.")
    _add_trace(p)
    p.add_argument("-o", "--output", required=True, help="the HTML file to write")
    p.add_argument("--max-slices", type=int, default=200_000,
                   help="most slices drawn in the timeline; the longest are kept "
                        "(default 200000)")
    _add_incomplete(p)

    p = sub.add_parser("diff", help="what changed between two traces",
                       description="Compares two traces: totals, ops added/removed/changed "
                       "(calls, device time), segments and syncs.")
    _add_trace(p, "a", "the first (baseline) trace")
    _add_trace(p, "b", "the second trace")
    p.add_argument("--top", type=int, default=30, help="rows per table (default 30)")
    p.add_argument("--tolerance", type=float, default=0.10,
                   help="relative device-time change still counted as the same (default 0.10)")
    p.add_argument("--json", action="store_true", help="print the diff as JSON data")
    _add_incomplete(p)

    from .replay_report import add_parser as add_replay
    add_replay(sub)
    return parser


def _run(args) -> int:
    from . import html, perfetto
    from .diff import diff
    from .summary import summarize
    from .text import format_diff, format_summary

    inc = args.allow_incomplete
    if args.command == "replay":
        from .replay_report import run as run_replay
        return run_replay(args)
    if args.command == "summary":
        s = summarize(load(args.trace, allow_incomplete=inc))
        if args.json:
            json.dump(s.to_dict(), sys.stdout, indent=1, default=str)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(format_summary(s, top=args.top))
    elif args.command == "perfetto":
        n = perfetto.write(load(args.trace, allow_incomplete=inc), args.output)
        print(f"wrote {args.output}: {n} trace events (open in https://ui.perfetto.dev)")
    elif args.command == "html":
        trace = load(args.trace, allow_incomplete=inc)
        size = html.write(trace, args.output, max_slices=args.max_slices)
        print(f"wrote {args.output}: {size} bytes")
    elif args.command == "diff":
        a = summarize(load(args.a, allow_incomplete=inc))
        b = summarize(load(args.b, allow_incomplete=inc))
        d = diff(a, b, args.a, args.b, time_tolerance=args.tolerance)
        if args.json:
            json.dump(dataclasses.asdict(d), sys.stdout, indent=1, default=str)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(format_diff(d, top=args.top))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (TraceFormatError, ValueError) as e:
        print(f"neuron-trace: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # piped into head
        return 0
    except OSError as e:
        print(f"neuron-trace: error: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
