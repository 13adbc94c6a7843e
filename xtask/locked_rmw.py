#!/usr/bin/env python3
"""Counts the locked read-modify-write instructions a profiled program executed.

Atomic read-modify-writes (`lock`-prefixed instructions and `xchg` with memory: reference
count changes, mutex locks and unlocks, compare-and-swaps) cost far more cycles than their
instruction count suggests, so an instruction count alone under-weights them. This reads a
callgrind profile recorded with per-instruction costs, finds the binary's locked instructions
with `objdump`, and prints how often they ran — in total per iteration, and by the source line
(through `addr2line`'s inline chains) of the code that owns them.

    valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file=cg.out BINARY
    python3 xtask/locked_rmw.py cg.out BINARY ITERATIONS [TOP]

With `crates/subagent-spawn/examples/spawn_profile.rs` (ITERATIONS = its delegation count,
2000 by default) the total is the locked read-modify-writes of one `spawn` delegation.
"""

import collections
import os
import re
import subprocess
import sys

LIBRARY_FRAME = re.compile(r"^(core|alloc|std)/|^(parking_lot|lock_api)-")


def locked_addresses(binary):
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", binary],
                         capture_output=True, text=True, check=True).stdout
    found = set()
    for line in out.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\s+(.*)$", line)
        if not m:
            continue
        insn = m.group(2)
        if re.match(r"lock\b", insn) or (re.match(r"xchg\s", insn) and "(" in insn):
            found.add(int(m.group(1), 16))
    return found


def executions(profile, binary, wanted):
    """Self cost (= executions, for the `Ir` event) of each wanted address in `binary`."""
    counts = collections.Counter()
    names = {"ob": {}, "fn": {}}
    ob = None
    addr = 0
    after_calls = False
    with open(profile) as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"(c?)(ob|fn|fl|fi|fe)=\((\d+)\)(?: (.*))?", line)
            if m:
                called, kind, ident, name = m.groups()
                table = names.get(kind)
                if table is not None and name:
                    table[ident] = name
                if not called and kind == "ob":
                    ob = names["ob"].get(ident)
                continue
            if line.startswith("calls="):
                after_calls = True
                continue
            if not line or line[0] not in "0123456789+-*":
                continue
            parts = line.split()
            pos = parts[0]
            if pos.startswith("0x"):
                addr = int(pos, 16)
            elif pos.startswith("+"):
                addr += int(pos[1:])
            elif pos.startswith("-"):
                addr -= int(pos[1:])
            if after_calls:
                # The inclusive cost of a call, not this instruction's own.
                after_calls = False
                continue
            if ob == binary and addr in wanted and len(parts) >= 3:
                counts[addr] += int(parts[-1])
    return counts


def owners(binary, addresses):
    """The first non-library source line of each address's inline chain."""
    if not addresses:
        return {}
    out = subprocess.run(["addr2line", "-a", "-i", "-f", "-C", "-e", binary]
                         + [hex(a) for a in addresses],
                         capture_output=True, text=True, check=True).stdout
    chunks = re.split(r"^0x0*([0-9a-f]+)\n", out, flags=re.M)[1:]
    result = {}
    for i in range(0, len(chunks), 2):
        lines = chunks[i + 1].strip().splitlines()
        frames = [(lines[j], lines[j + 1]) for j in range(0, len(lines) - 1, 2)]
        # Drop glue and the like inline only library frames: name the outermost function.
        owner = f"[{frames[-1][0][:80]}]" if frames else "?"
        for function, location in frames:
            location = re.sub(r"/rustc/\w+/library/", "", location)
            location = re.sub(r"^.*/registry/src/[^/]+/", "", location)
            location = re.sub(r"^.*?/crates/", "", location).split(" ")[0]
            if not LIBRARY_FRAME.match(location):
                owner = f"{location} [{function[:60]}]"
                break
        result[int(chunks[i], 16)] = owner
    return result


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    profile, binary, iterations = sys.argv[1], sys.argv[2], int(sys.argv[3])
    top = int(sys.argv[4]) if len(sys.argv) > 4 else 25
    binary = os.path.realpath(binary)
    counts = executions(profile, binary, locked_addresses(binary))
    total = sum(counts.values())
    print(f"locked read-modify-writes per iteration: {total / iterations:.1f}")
    frequent = [a for a, c in counts.items() if c >= iterations // 2]
    by_owner = collections.Counter()
    for address, owner in owners(binary, frequent).items():
        by_owner[owner] += counts[address]
    for owner, count in by_owner.most_common(top):
        print(f"{count / iterations:8.1f}  {owner}")


if __name__ == "__main__":
    main()
