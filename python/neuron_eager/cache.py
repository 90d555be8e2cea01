"""Inspect the tier-2 kernel cache (NEURON_CACHE_DIR, bounded by NEURON_CACHE_MAX_BYTES).

    python -m neuron_eager.cache list     # entries, newest use first: size, last use, flags
    python -m neuron_eager.cache verify   # every kernel against its checksum (exit 1: corrupt)
    python -m neuron_eager.cache clear    # remove every entry no process is using now, and
                                          # the guard's kept verdicts

--dir ROOT picks another cache root; --json prints the scan as JSON. Safe while other
processes use the cache: entries they hold locked are skipped, and a process that loaded
a kernel keeps running it after its files are removed. A corrupt entry is rebuilt on
its next use.
"""

import argparse
import json
import sys
import time

from . import _C


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB"


def scan(root: str, checksums: bool = False) -> dict:
    """The cache under root: {'dir', 'entries': [{'key', 'bytes', 'last_use' (Unix
    seconds), 'kernel', 'verified', 'state'}], 'total_bytes', 'temporaries', ...}; state is
    'intact' or 'corrupt' with checksums (for entries with a kernel), else ''."""
    return _C.native_cache_scan(root, checksums)


def _list(root: str, as_json: bool) -> int:
    s = scan(root)
    if as_json:
        print(json.dumps(s))
        return 0
    bound = _C.native_cache_max_bytes()
    print(f"{s['dir']}: {len(s['entries'])} entries, {_mib(s['total_bytes'])} of "
          f"{_mib(bound)} (NEURON_CACHE_MAX_BYTES), {s['temporaries']} temporaries")
    if s["entries"]:
        print(f"{'key':<18} {'bytes':>10}  {'last use':<19}  flags")
    for e in sorted(s["entries"], key=lambda e: -e["last_use"]):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["last_use"]))
        flags = ",".join(f for f, on in (("kernel", e["kernel"]), ("verified", e["verified"])) if on)
        print(f"{e['key']:<18} {e['bytes']:>10}  {when:<19}  {flags or '-'}")
    return 0


def _verify(root: str, as_json: bool) -> int:
    s = scan(root, checksums=True)
    kernels = [e for e in s["entries"] if e["kernel"]]
    corrupt = [e for e in kernels if e["state"] != "intact"]
    if as_json:
        print(json.dumps(s))
    else:
        for e in corrupt:
            print(f"corrupt: {e['key']} (rebuilt on its next use)")
        print(f"{s['dir']}: {len(kernels) - len(corrupt)} kernels intact, {len(corrupt)} corrupt")
    return 1 if corrupt else 0


def _clear_verdicts(root: str) -> int:
    """Removes the guard's kept verdicts (verdicts-v1/<context>/<key>); how many."""
    import os
    import shutil

    folder = os.path.join(root, "verdicts-v1")
    count = sum(len(files) for _, _, files in os.walk(folder))
    shutil.rmtree(folder, ignore_errors=True)
    return count


def _clear(root: str, as_json: bool) -> int:
    removed, busy, temporaries = _C.native_cache_clear(root)
    verdicts = _clear_verdicts(root)
    if as_json:
        print(json.dumps({"removed": removed, "busy": busy, "temporaries": temporaries,
                          "verdicts": verdicts}))
    else:
        print(f"removed {removed} entries, {temporaries} stale temporaries and {verdicts} guard verdicts"
              + (f"; {busy} in use by another process kept" if busy else ""))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m neuron_eager.cache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["list", "verify", "clear"])
    p.add_argument("--dir", help="cache root (default: NEURON_CACHE_DIR or the user cache)")
    p.add_argument("--json", action="store_true", help="print JSON")
    a = p.parse_args(argv)
    root = a.dir or _C.native_cache_dir()
    if not root:
        p.error("no cache folder: set NEURON_CACHE_DIR or pass --dir")
    return {"list": _list, "verify": _verify, "clear": _clear}[a.command](root, a.json)


if __name__ == "__main__":
    sys.exit(main())
