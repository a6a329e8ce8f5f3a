"""Which of two equal-size free blocks PyTorch's caching allocator hands out next: two 24 MiB
tensors, each its own segment (the fake driver places the second below the first), both freed,
then one more 24 MiB request. Prints one JSON line: the three addresses and the rule they show,
"address" (the lower address wins) or "segment_age" (the segment made first wins), which
`vramshim whatif` must take for this release (tests/tests/fakegpu_torch.rs).

usage: python torch_ties.py [ANY]   (the argument is ignored: the test harness passes a mode)
"""
import json

import torch

MIB = 1 << 20
first = torch.empty(24 * MIB, dtype=torch.uint8, device="cuda")
second = torch.empty(24 * MIB, dtype=torch.uint8, device="cuda")
first_addr, second_addr = first.data_ptr(), second.data_ptr()
del first, second
got = torch.empty(24 * MIB, dtype=torch.uint8, device="cuda").data_ptr()
if first_addr < second_addr:
    rule = "ambiguous: the segment made first is also the lower"
elif got == first_addr:
    rule = "segment_age"
elif got == second_addr:
    rule = "address"
else:
    rule = "neither"
print(json.dumps({"torch": torch.__version__, "first": first_addr, "second": second_addr,
                  "got": got, "rule": rule}))
