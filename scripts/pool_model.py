#!/usr/bin/env python3
"""The fake driver's model of the stream-ordered default pool (fakegpu/src/cuda/pool.c), run on
a sequence the real driver recorded (tests/fakegpu/pool-h200/*.jsonl, by record.py on an H200):
the model's ReservedMemCurrent after every op against the card's, and its error.

    scripts/pool_model.py tests/fakegpu/pool-h200/pool-seed1-keep.jsonl [threshold]
    scripts/pool_model.py --log LOG.vlog     (a recording's cudaMallocAsync/cudaFreeAsync/
                                              TrimTo calls: the model's reserved high)

threshold: the pool's release threshold (default UINT64_MAX, as torch sets it; 0 for seed 3).
--table prints one line per op (op size-or-alloc-index real_rc real_uc model_rc), the file
tests/fakegpu/pool_replay.c replays.

The model: one address range; blocks = requested size rounded up to 512 B; next fit: an
allocation takes the start of the first free range it fits in at or after the end of the last
block placed, else of the first one from the start (freed neighbours merge), else goes on at the
end of the range in use (with a free tail). Reserved memory is
32 MiB granules: at least as many as live blocks touch (it only grows when more are touched than
held). A sync gives back untouched granules while more than the threshold is held; TrimTo(keep)
the same down to keep."""
import json
import sys

GRANULE = 32 << 20
ALIGN = 512


class Pool:
    def __init__(self, threshold):
        self.threshold = threshold
        self.free = []  # [start, end], by address
        self.top = 0
        self.next_fit = 0  # where the last block placed ends
        self.blocks = {}  # granule -> live blocks touching it
        self.reserved = 0
        self.used = 0

    def _touch(self, at, size, d):
        for g in range(at // GRANULE, (at + size - 1) // GRANULE + 1):
            self.blocks[g] = self.blocks.get(g, 0) + d
            if self.blocks[g] == 0:
                del self.blocks[g]

    def alloc(self, size):
        rounded = -(-size // ALIGN) * ALIGN
        fits = [i for i, f in enumerate(self.free) if f[1] - f[0] >= rounded]
        after = [i for i in fits if self.free[i][0] >= self.next_fit]
        best = (after or fits or [None])[0]
        if best is not None:
            f = self.free[best]
            at = f[0]
            f[0] += rounded
            if f[0] == f[1]:
                self.free.pop(best)
        else:
            at = self.top
            if self.free and self.free[-1][1] == self.top:
                at = self.free.pop()[0]
            self.top = at + rounded
        self.next_fit = at + rounded
        self._touch(at, rounded, 1)
        self.reserved = max(self.reserved, len(self.blocks) * GRANULE)
        self.used += size
        return at, rounded

    def release(self, at, rounded, size):
        self._touch(at, rounded, -1)
        self.used -= size
        i = 0
        while i < len(self.free) and self.free[i][0] < at:
            i += 1
        self.free.insert(i, [at, at + rounded])
        if i + 1 < len(self.free) and self.free[i + 1][0] == at + rounded:
            self.free[i][1] = self.free.pop(i + 1)[1]
        if i > 0 and self.free[i - 1][1] == at:
            self.free[i - 1][1] = self.free.pop(i)[1]

    def trim(self, keep):
        spare = (self.reserved - len(self.blocks) * GRANULE) // GRANULE
        over = -(-(self.reserved - keep) // GRANULE) if self.reserved > keep else 0
        self.reserved -= min(spare, over) * GRANULE


def replay(ops, threshold):
    """Yields (op, argument, real rc, real uc, model rc, model uc) per op."""
    pool = Pool(threshold)
    live = {}  # real address -> (model offset, rounded, size, alloc index)
    allocs = 0
    for op in ops:
        if op["op"] == "alloc":
            at, rounded = pool.alloc(op["size"])
            live[op["addr"]] = (at, rounded, op["size"], allocs)
            arg = op["size"]
            allocs += 1
        elif op["op"] == "free":
            at, rounded, size, index = live.pop(op["addr"])
            pool.release(at, rounded, size)
            arg = index
        elif op["op"] == "sync":
            pool.trim(threshold)
            arg = 0
        else:  # trim to 0
            pool.trim(0)
            arg = 0
        yield op["op"], arg, op["rc"], op["uc"], pool.reserved, pool.used


def log_reserved_high(path):
    """The model's reserved high over a recording's device-0 stream-ordered calls (threshold
    UINT64_MAX, as torch sets it), with `vramshim dump --json` ($VRAMSHIM or on PATH)."""
    import os
    import subprocess
    dump = subprocess.run([os.environ.get("VRAMSHIM", "vramshim"), "dump", "--json", path],
                          capture_output=True, text=True, check=True).stdout
    pool, live, high = Pool((1 << 64) - 1), {}, 0
    for line in dump.splitlines():
        e = json.loads(line)
        if e.get("type") != "event" or e.get("device") != 0:
            continue
        if e["api"] == "cudaMallocAsync" and e["event"] == "alloc" and e["result"] == 0:
            live[e["addr"]] = pool.alloc(e["size"]) + (e["size"],)
        elif e["api"] == "cudaFreeAsync" and e["addr"] in live:
            pool.release(*live.pop(e["addr"]))
        elif e["api"] == "cudaMemPoolTrimTo":
            pool.trim(e["size"])
        high = max(high, pool.reserved)
    print(f"{path}: model reserved high {high} B ({high >> 20} MiB)")


def main():
    if sys.argv[1] == "--log":
        for path in sys.argv[2:]:
            log_reserved_high(path)
        return
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    threshold = int(args[1]) if len(args) > 1 else (1 << 64) - 1
    ops = [json.loads(line) for line in open(args[0])]
    rows = list(replay(ops, threshold))
    if "--table" in sys.argv:
        for op, arg, rc, uc, model_rc, _ in rows:
            print(op[0], arg, rc, uc, model_rc)
        return
    errors = [abs(r[4] - r[2]) for r in rows]
    used_exact = sum(r[5] == r[3] for r in rows)
    real_high, model_high = max(r[2] for r in rows), max(r[4] for r in rows)
    exact = sum(e == 0 for e in errors)
    print(f"{args[0]}: {len(rows)} ops, used exact {used_exact}, reserved exact {exact}, "
          f"|model - real| max {max(errors) >> 20} MiB mean {sum(errors) / len(errors) / 2**20:.1f} MiB; "
          f"reserved high model {model_high >> 20} MiB real {real_high >> 20} MiB")


if __name__ == "__main__":
    main()
