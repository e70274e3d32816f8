#!/usr/bin/env python3
"""tools/trace_overlap.py — how much of a communicator's busy time a --profile trace shows hidden
behind compute spans: for each trace_rank*.json given, the union of the chosen comm track's
operations (ts .. ts+dur), the part of it that coincides with compute spans whose name starts
with a prefix (default "tp ": the tensor-parallel layers' GEMMs, parallel/tp/layers.h SpanSink),
the exposed rest, and both against the summed forward+backward spans. Reads only the trace.

  python3 tools/trace_overlap.py runs/x/trace_rank0.json [--track comm:tp] [--prefix "tp "]
"""
import argparse
import json
import sys


def union(intervals):
    out = []
    for b, e in sorted(intervals):
        if out and b <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([b, e])
    return out


def length(intervals):
    return sum(e - b for b, e in intervals)


def intersect(a, b):
    """Both sorted, disjoint."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def analyse(path, track, prefix):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    comm = union([(e["ts"], e["ts"] + e["dur"]) for e in spans if names.get(e["tid"]) == track])
    gemm = union([(e["ts"], e["ts"] + e["dur"]) for e in spans
                  if names.get(e["tid"]) == "compute" and e["name"].startswith(prefix)])
    step = sum(e["dur"] for e in spans if names.get(e["tid"]) == "compute" and e["name"] in ("forward", "backward"))
    busy, hidden = length(comm), length(intersect(comm, gemm))
    return {"ops": sum(1 for e in spans if names.get(e["tid"]) == track), "busy_ms": busy / 1e3,
            "hidden_ms": hidden / 1e3, "exposed_ms": (busy - hidden) / 1e3, "fwd_bwd_ms": step / 1e3}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--track", default="comm:tp")
    ap.add_argument("--prefix", default="tp ")
    a = ap.parse_args()
    print(f"{'trace':40} {'ops':>6} {'busy ms':>9} {'hidden ms':>10} {'exposed ms':>11} {'hidden %':>9} "
          f"{'exposed/fwd+bwd %':>18}")
    for p in a.traces:
        r = analyse(p, a.track, a.prefix)
        if r["ops"] == 0:
            print(f"{p}: no operations on track {a.track}", file=sys.stderr)
            continue
        hidden_pct = 100 * r["hidden_ms"] / r["busy_ms"] if r["busy_ms"] else 0.0
        exposed_pct = 100 * r["exposed_ms"] / r["fwd_bwd_ms"] if r["fwd_bwd_ms"] else 0.0
        print(f"{p:40} {r['ops']:6d} {r['busy_ms']:9.1f} {r['hidden_ms']:10.1f} {r['exposed_ms']:11.1f} "
              f"{hidden_pct:9.1f} {exposed_pct:18.1f}")


if __name__ == "__main__":
    main()
