#!/usr/bin/env python3
"""How many synchronous store reads a read-back policy would have saved, from a pager trace.

Input: the files a region writes under STRATA_PAGER_TRACE=PREFIX (see
crates/strata-pager/src/region/trace.rs): 16-byte records (kind<<56 | page, extra).
Kinds: 0 header (page bytes, frames), 1 evicted (page, batch), 2 demand fill (page, zero?),
3 filled without a fault of its own (read-ahead, read with a demand page, prefetch).

Model. The trace is replayed as it happened; a policy adds read-backs on top. On every demand
fill from the store that the policy did not cover (a synchronous read in its world), it reads
back candidate pages that are in the store and not resident (evicted, not filled since, not
already read back). Time is counted in frames consumed (every fill, read-backs included), so
that reading back more pages shortens everyone's stay. A read-back page is a hit if its demand
fault comes within W frames consumed after the read-back (W = the buffer's frames: how long a
page stays under FIFO; 0.5 W as a stricter check), else it is wasted (it took a frame for
nothing). The trace itself is
not changed by the read-backs (their extra frames would evict other pages sooner; the
`wasted` column is that cost's measure). Pages the existing stream read-ahead filled count as
neither hit nor waste when a read-back got there too.

Usage: readback_bound.py TRACE [TRACE...] [--json OUT]
"""

import json
import struct
import sys
from array import array

EVICTED, DEMAND, AHEAD = 1, 2, 3


def load(path):
    raw = open(path, "rb").read()
    n = len(raw) // 16
    words = array("Q")
    words.frombytes(raw[: n * 16])
    if sys.byteorder != "little":
        words.byteswap()
    return words


def policies(max_k=(2, 4, 8, 16)):
    out = [("none", None, 0)]
    for k in max_k:
        out.append((f"batch-{k}", "batch", k))
    for k in max_k:
        out.append((f"evict-order-{k}", "evseq", k))
    for k in (4, 8, 16):
        out.append((f"address-cluster-{k}", "addr", k))
    return out


def simulate(words, kind, k, window_factor=1.0):
    page_bytes = words[0] & ((1 << 56) - 1)
    frames = words[1]
    window = max(1, int(frames * window_factor))
    absent = {}  # page -> (batch, eviction position) while it is in the store only
    batches = {}  # batch -> sorted pages
    order = array("Q")  # pages in eviction order
    read_back = {}  # page -> eviction count when it was read back
    evictions = 0  # the clock: frames consumed (fills of any kind, read-backs included)
    stats = dict(demand_reads=0, zero_fills=0, hits=0, synchronous=0, read_back_pages=0,
                 read_back_ops=0, wasted=0, taken_by_stream=0)
    for i in range(2, len(words), 2):
        head, extra = words[i], words[i + 1]
        ev = head >> 56
        page = head & ((1 << 56) - 1)
        if ev == EVICTED:
            absent[page] = (extra, len(order))
            batches.setdefault(extra, []).append(page)
            order.append(page)
            if page in read_back:  # resident by then in its world too: neither hit nor fault
                del read_back[page]
            continue
        if ev == AHEAD:
            evictions += 1
            absent.pop(page, None)
            if page in read_back:
                del read_back[page]
                stats["taken_by_stream"] += 1
            continue
        if ev != DEMAND:
            continue
        if extra == 1:
            evictions += 1
            stats["zero_fills"] += 1
            absent.pop(page, None)
            read_back.pop(page, None)
            continue
        stats["demand_reads"] += 1
        at = read_back.pop(page, None)
        where = absent.pop(page, None)
        if at is not None:
            if evictions - at <= window:
                stats["hits"] += 1
                continue
            stats["wasted"] += 1
        stats["synchronous"] += 1
        evictions += 1
        if kind is None or where is None:
            continue
        batch, pos = where
        want = k - 1
        cands = []
        if kind == "batch":
            members = sorted(batches.get(batch, ()))
            # The members nearest the faulting page in the batch (written as neighbours).
            j = members.index(page) if page in members else 0
            lo, hi = j - 1, j + 1
            while len(cands) < want and (lo >= 0 or hi < len(members)):
                for q in ((members[hi] if hi < len(members) else None),
                          (members[lo] if lo >= 0 else None)):
                    if q is not None and len(cands) < want:
                        w = absent.get(q)
                        if w is not None and w[0] == batch and q not in read_back:
                            cands.append(q)
                lo -= 1
                hi += 1
        elif kind == "evseq":
            lo, hi = pos - 1, pos + 1
            span = 0
            while len(cands) < want and span < 4 * k:
                for p2 in (hi, lo):
                    if 0 <= p2 < len(order) and len(cands) < want:
                        q = order[p2]
                        w = absent.get(q)
                        if w is not None and w[1] == p2 and q not in read_back:
                            cands.append(q)
                lo -= 1
                hi += 1
                span += 1
        elif kind == "addr":
            base = page - page % k
            for q in range(base, base + k):
                if q != page and q in absent and q not in read_back:
                    cands.append(q)
        if cands:
            stats["read_back_ops"] += 1
        for q in cands:
            read_back[q] = evictions
            evictions += 1
            stats["read_back_pages"] += 1
    # Read-backs still pending at the end were never used.
    stats["wasted"] += len(read_back)
    stats["page_bytes"] = page_bytes
    stats["frames"] = frames
    stats["window_evictions"] = window
    return stats


def main():
    args = sys.argv[1:]
    out = None
    if "--json" in args:
        i = args.index("--json")
        out = args[i + 1]
        del args[i : i + 2]
    report = {}
    for path in args:
        words = load(path)
        if len(words) < 4:
            continue
        rows = {}
        print(f"{path}: {len(words) // 2} records, page {words[0] & ((1 << 56) - 1)} B, "
              f"{words[1]} frames")
        print(f"  {'policy':22} {'W':>5} {'sync reads':>10} {'cut':>7} {'read back':>10} "
              f"{'hits':>8} {'wasted':>8} {'waste %':>7} {'ops':>8}")
        base = None
        for name, kind, k in policies():
            for wf in ((1.0,) if kind is None else (1.0, 0.5)):
                s = simulate(words, kind, k, wf)
                if base is None:
                    base = s["synchronous"]
                cut = 1 - s["synchronous"] / base if base else 0.0
                waste = s["wasted"] / s["read_back_pages"] if s["read_back_pages"] else 0.0
                s["cut"] = cut
                s["waste_fraction"] = waste
                rows[f"{name}@W{wf}"] = s
                print(f"  {name:22} {wf:5.1f} {s['synchronous']:10d} {cut:7.1%} "
                      f"{s['read_back_pages']:10d} {s['hits']:8d} {s['wasted']:8d} "
                      f"{waste:7.1%} {s['read_back_ops']:8d}")
        report[path] = rows
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
