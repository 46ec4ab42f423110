#!/usr/bin/env python3
"""Medians of the read-back A/B runs (`strata bench run` JSON records): per read-back setting
and contestant, wall seconds, faults, MiB in and out, and the seconds spent waiting on faults.

Usage: summarize.py FILE... (names carry the setting as `rbN`)"""
import json
import re
import statistics
import sys

table = {}
for path in sys.argv[1:]:
    m = re.search(r"rb(\d+)(-[a-z]+)?", path)
    setting = f"rb{m.group(1)}{m.group(2) or ''}" if m else path
    for row in json.load(open(path))["results"]["rows"]:
        if row["contestant"] == "no limit" or not row["ok"]:
            continue
        table.setdefault((row["contestant"], setting), []).append(row)
print(f"{'contestant':14} {'setting':10} {'runs':>4} {'wall s (each)':30} {'faults':>8} "
      f"{'MiB in':>7} {'MiB out':>7} {'fault wait s':>12}")
for (contestant, setting), rows in sorted(table.items()):
    med = lambda k: statistics.median(r[k] for r in rows)
    walls = ", ".join(f"{r['wall_s']:.2f}" for r in rows)
    print(f"{contestant:14} {setting:10} {len(rows):4d} {med('wall_s'):6.2f} ({walls:22}) "
          f"{med('faults'):8.0f} {med('bytes_in') / 2**20:7.0f} {med('bytes_out') / 2**20:7.0f} "
          f"{med('fault_wait_s'):12.2f}")
