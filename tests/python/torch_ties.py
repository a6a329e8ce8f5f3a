"""Which of equal-size free blocks PyTorch's caching allocator hands out next: 24 MiB tensors,
each its own segment, until one lies below the first, all freed, then one more 24 MiB
request. Prints one JSON line: the segments' addresses, the block handed out and the rule they show,
"address" (the lower address wins) or "segment_age" (the segment made first wins), which
`vramshim whatif` must take for this release (tests/tests/fakegpu_torch.rs).

usage: python torch_ties.py [ANY]   (the argument is ignored: the test harness passes a mode)
"""
import json

import torch

MIB = 1 << 20
# Segments until one lies below the first (the fake driver mostly places each new mapping
# below the last, but now and then in a hole above): then the two rules pick different blocks.
held = [torch.empty(24 * MIB, dtype=torch.uint8, device="cuda")]
while len(held) < 12 and min(t.data_ptr() for t in held) == held[0].data_ptr():
    held.append(torch.empty(24 * MIB, dtype=torch.uint8, device="cuda"))
addrs = [t.data_ptr() for t in held]
del held
got = torch.empty(24 * MIB, dtype=torch.uint8, device="cuda").data_ptr()
if min(addrs) == addrs[0]:
    rule = "ambiguous: the segment made first is also the lowest"
elif got == addrs[0]:
    rule = "segment_age"
elif got == min(addrs):
    rule = "address"
else:
    rule = "neither"
print(json.dumps({"torch": torch.__version__, "segments": addrs, "got": got, "rule": rule}))
