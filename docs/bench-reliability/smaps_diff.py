"""Where a process's resident memory sits, mapping by mapping, and what grew between two looks.

    python docs/bench-reliability/smaps_diff.py snap PID FILE     # write PID's mappings to FILE
    python docs/bench-reliability/smaps_diff.py diff OLD NEW      # the mappings whose RSS moved

A leak grows the mappings that hold it (the heap, an allocator arena, a tensor's block) and
keeps them grown; memory freed within a step leaves the mappings that persist as they were.
Read from /proc/PID/smaps, so it can look at a running worker without touching it (issue 13's
soak: docs/benchmarks.md, "The soak's memory bound, measured at the floor").
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

_RANGE = re.compile(r"^([0-9a-f]+)-[0-9a-f]+ ")


def mappings(pid: int) -> dict[str, int]:
    """``"start name"`` -> resident kB, for every mapping of ``pid`` (by where it starts, so
    a mapping that grows at its end, as a heap or an allocator's arena does, keeps its key)."""
    out: dict[str, int] = {}
    key = None
    for line in pathlib.Path(f"/proc/{pid}/smaps").read_text().splitlines():
        m = _RANGE.match(line)
        if m:
            fields = line.split()
            key = f"{m.group(1)} {fields[5] if len(fields) > 5 else '[anon]'}"
        elif line.startswith("Rss:") and key is not None:
            out[key] = int(line.split()[1])
    return out


def diff(old: dict[str, int], new: dict[str, int]) -> list[tuple[str, int, int]]:
    """(mapping, kB before, kB after) for each mapping whose resident size changed, the ones
    that came or went included (0 where absent), largest change first."""
    moved = [(k, old.get(k, 0), new.get(k, 0)) for k in old.keys() | new.keys()
             if old.get(k, 0) != new.get(k, 0)]
    return sorted(moved, key=lambda m: -abs(m[2] - m[1]))


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "snap":
        pathlib.Path(argv[2]).write_text(json.dumps(mappings(int(argv[1]))))
        return 0
    if len(argv) == 3 and argv[0] == "diff":
        old, new = (json.loads(pathlib.Path(p).read_text()) for p in argv[1:])
        moved = diff(old, new)
        for key, before, after in moved:
            print(f"{after - before:+10d} kB  {before:9d} -> {after:9d}  {key}")
        total = sum(new.values()) - sum(old.values())
        print(f"resident: {sum(old.values()) / 1024:.1f} -> {sum(new.values()) / 1024:.1f} MB "
              f"({total / 1024:+.2f} MB) over {len(new)} mappings; {len(moved)} moved")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
