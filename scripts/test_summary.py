#!/usr/bin/env python3
"""Sums individual test cases over one or more meson testlog.json files.

gtest programs report "[  PASSED  ] N tests", "[  FAILED  ] N tests", "[  SKIPPED ] N tests";
other test programs print a line "N passed, N failed[, N skipped]" themselves. A program that
crashed or timed out without such lines counts as one failure; one that meson skipped (exit 77)
counts as one skip. Prints the closing line and exits 1 if anything failed.
"""
import json
import re
import sys


def count(entry):
    out = (entry.get("stdout") or "") + "\n" + (entry.get("stderr") or "")
    result = entry.get("result", "")
    if result == "SKIP":
        return 0, 0, 1
    passed = failed = skipped = 0
    found = False
    m = re.search(r"^\[  PASSED  \] (\d+) tests?", out, re.M)
    if m:
        passed, found = int(m.group(1)), True
    m = re.search(r"^\[  FAILED  \] (\d+) tests?, listed below", out, re.M)
    if m:
        failed, found = int(m.group(1)), True
    m = re.search(r"^\[  SKIPPED \] (\d+) tests?", out, re.M)
    if m:
        skipped, found = int(m.group(1)), True
    if not found:
        lines = re.findall(r"^(?:\w+: )?(\d+) passed, (\d+) failed(?:, (\d+) skipped)?\s*$", out, re.M)
        if lines:
            p, f, s = lines[-1]
            passed, failed, skipped, found = int(p), int(f), int(s or 0), True
    if not found:
        return (1, 0, 0) if result == "OK" else (0, 1, 0)
    if result not in ("OK", "EXPECTEDFAIL") and failed == 0:
        failed = 1  # crashed or timed out after its summary
    return passed, failed, skipped


def main():
    totals = [0, 0, 0]
    for path in sys.argv[1:]:
        try:
            with open(path) as f:
                entries = [json.loads(line) for line in f if line.strip()]
        except OSError as e:
            print(f"  {path}: no test log ({e.strerror}): the build or the test run did not happen")
            totals[1] += 1
            continue
        for entry in entries:
            p, fl, s = count(entry)
            totals[0] += p
            totals[1] += fl
            totals[2] += s
            print(f"  {path}: {entry.get('name')}: {entry.get('result')} ({p} passed, {fl} failed, {s} skipped)")
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 1 if totals[1] else 0


if __name__ == "__main__":
    sys.exit(main())
