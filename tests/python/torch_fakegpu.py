"""Real PyTorch on the fake GPU (tests/tests/fakegpu_torch.rs). One mode per run (argv[1]);
prints one JSON object per line: what torch says, and what the fake driver says (free/total
from cudaMemGetInfo through torch.cuda.mem_get_info)."""
import json
import os
import sys

import torch

MiB = 1 << 20


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


def say(**fields):
    print(json.dumps(fields), flush=True)


def stats():
    s = torch.cuda.memory_stats()
    # Torch 2.2 counts no num_device_alloc/free: without expandable segments its segment
    # counters are the same counts (each segment one cudaMalloc); with them it counts nothing.
    expandable = "expandable_segments:True" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "num_device_alloc" not in s and "segment.all.allocated" in s and not expandable:
        s["num_device_alloc"] = s["segment.all.allocated"]
        s["num_device_free"] = s["segment.all.freed"]
    return {
        "num_alloc_retries": s.get("num_alloc_retries", 0),
        "num_ooms": s.get("num_ooms", 0),
        "reserved_peak": s.get("reserved_bytes.all.peak", 0),
        "allocated_peak": s.get("allocated_bytes.all.peak", 0),
        "reserved": s.get("reserved_bytes.all.current", 0),
        "num_device_alloc": s.get("num_device_alloc", 0),
        "num_device_free": s.get("num_device_free", 0),
    }


def mlp():
    """The small MLP of train, trace and snapshot, on the device."""
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 10)).cuda()


def encoder(num_layers):
    """A TransformerEncoder of `num_layers` copies of one layer, on the device: (layer, model)."""
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024,
                                             dropout=0.0, batch_first=True)
    return layer, torch.nn.TransformerEncoder(layer, num_layers=num_layers,
                                              enable_nested_tensor=False).cuda()


def seeded():
    """Seed 0, and attention on torch's own (flash) kernels, the path the figures of the
    transformer modes were taken on."""
    torch.manual_seed(0)
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):  # torch 2.2 has no cuDNN attention
        torch.backends.cuda.enable_cudnn_sdp(False)


def start_history():
    """The set-up of the modes that compare with torch's own memory history: seeded, the
    history recorded."""
    seeded()
    torch.cuda.memory._record_memory_history(max_entries=10_000_000)


def mlp_then_transformer(after_step=lambda: None):
    """The workload of trace and snapshot: two Adam steps of the MLP, its memory given back to
    the driver (segment_free, or segment_unmap when expandable), then two steps of a 2-layer
    transformer (sequence lengths 64 and 384), `after_step()` after each. Returns what stays
    live, for the caller to keep: (model, layer, optimizer, x)."""
    net = mlp()
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for _ in range(2):
        optimizer.zero_grad()
        data = torch.randn(256, 512, device="cuda")
        target = torch.randint(0, 10, (256,), device="cuda")
        torch.nn.functional.cross_entropy(net(data), target).backward()
        optimizer.step()
    del net, optimizer, data, target
    torch.cuda.empty_cache()
    layer, model = encoder(2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for length in (64, 384):
        optimizer.zero_grad(set_to_none=True)
        x = torch.randn(16, length, 256, device="cuda")
        model(x).square().mean().backward()
        optimizer.step()
        after_step()
    return model, layer, optimizer, x


def caching():
    """The native caching allocator: small (2 MiB), large (20 MiB) and oversize segments,
    then empty_cache; at each step torch's reserved bytes against the driver's used bytes."""
    steps = []
    a = torch.empty(1000, dtype=torch.uint8, device="cuda")  # small pool: one 2 MiB segment
    steps.append(("small", torch.cuda.memory_reserved(), used()))
    b = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")  # large pool: 20 MiB segment
    steps.append(("large", torch.cuda.memory_reserved(), used()))
    c = torch.empty(50 * MiB, dtype=torch.uint8, device="cuda")  # its own 50 MiB segment
    steps.append(("huge", torch.cuda.memory_reserved(), used()))
    del a, b, c
    steps.append(("freed", torch.cuda.memory_reserved(), used()))
    torch.cuda.empty_cache()
    steps.append(("emptied", torch.cuda.memory_reserved(), used()))
    say(mode="caching", steps=steps, **stats())


def oom():
    keep = torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
    try:
        torch.empty(600 * MiB, dtype=torch.uint8, device="cuda")
        say(mode="oom", message=None)
    except torch.OutOfMemoryError as error:
        say(mode="oom", message=str(error), used=used(), **stats())
    del keep


def expandable():
    x = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
    y = torch.empty(70 * MiB, dtype=torch.uint8, device="cuda")
    grown = (torch.cuda.memory_reserved(), used())
    del x, y
    torch.cuda.empty_cache()
    say(mode="expandable", grown=grown, emptied=(torch.cuda.memory_reserved(), used()),
        **stats())


def malloc_async():
    x = torch.empty(30 * MiB, dtype=torch.uint8, device="cuda")
    y = torch.empty(10 * MiB, dtype=torch.uint8, device="cuda")
    live = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), used())
    del x
    freed = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), used())
    torch.cuda.synchronize()
    synced = (torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), used())
    del y
    torch.cuda.empty_cache()
    say(mode="async", live=live, freed=freed, synced=synced,
        emptied=(torch.cuda.memory_reserved(), torch.cuda.memory_allocated(), used()))


def train():
    torch.manual_seed(0)
    model = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = torch.randn(256, 512, device="cuda")
    target = torch.randint(0, 10, (256,), device="cuda")
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    say(mode="train", steps=len(losses), reserved_now=torch.cuda.memory_reserved(), used=used(),
        **stats())


def roundtrip():
    """Host data copied to the device and back comes back unchanged."""
    x = torch.arange(1000, dtype=torch.float32)
    y = x.cuda().cpu()
    pinned = torch.empty(1000).pin_memory()
    with open("/proc/self/maps") as maps:
        runtimes = sorted({line.split("/")[-1].strip() for line in maps if "/libcudart.so" in line})
    say(mode="roundtrip", equal=bool(torch.equal(x, y)), pinned=pinned.is_pinned(),
        cuda=torch.version.cuda, runtimes=runtimes,
        device=torch.cuda.get_device_name(0), capability=list(torch.cuda.get_device_capability(0)),
        count=torch.cuda.device_count(), total=torch.cuda.mem_get_info()[1])


def transformer():
    """A small TransformerEncoder trained with Adam on batches of varying sequence length (the
    classic fragmentation case), in fp32 then under bf16 autocast, then an inference loop that
    empties the cache after each batch. At every step: torch's reserved bytes and the driver's
    used bytes (their difference is what is not torch's: the context)."""
    seeded()
    layer, model = encoder(3)
    head = torch.nn.Linear(256, 1000).cuda()
    params = list(model.parameters()) + list(head.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-4)
    lengths = [64, 384, 96, 512, 160, 448, 32, 320]
    steps = []

    def train_step(length, autocast):
        x = torch.randn(16, length, 256, device="cuda")
        target = torch.randint(0, 1000, (16 * length,), device="cuda")
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            logits = head(model(x)).reshape(-1, 1000)
            loss = torch.nn.functional.cross_entropy(logits.float(), target)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        steps.append((torch.cuda.memory_reserved(), used()))

    for length in lengths:
        train_step(length, autocast=False)
    for length in lengths:
        train_step(length, autocast=True)
    trained = stats()
    model.eval()
    inference = []
    with torch.no_grad():
        for length in lengths:
            before = torch.cuda.memory_stats().get("num_device_free", 0)
            head(model(torch.randn(16, length, 256, device="cuda"))).sum().item()
            torch.cuda.empty_cache()
            after = torch.cuda.memory_stats().get("num_device_free", 0)
            inference.append((after - before, torch.cuda.memory_reserved(), used()))
    say(mode="transformer", steps=steps, trained=trained, inference=inference, **stats())


def trace():
    """PyTorch's own memory history over an MLP, empty_cache() and a transformer training step,
    for the tensors recorded beside it: its alloc / free_requested / free_completed /
    segment_alloc / segment_map / segment_unmap entries (action, address, size), the allocated
    peak, and tensors of known sizes."""
    start_history()
    known = [torch.empty(1000, 3, device="cuda"), torch.empty(7, dtype=torch.uint8, device="cuda"),
             torch.empty(3 << 20, device="cuda")]
    model, layer, optimizer, x = mlp_then_transformer()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    entries = [[e["action"], e["addr"], e["size"]] for e in snapshot["device_traces"][0]
               if e["action"] in ("alloc", "free_requested", "free_completed", "segment_alloc",
                                  "segment_map", "segment_unmap")]
    known = [[t.data_ptr(), t.nbytes] for t in known]
    segments = [[s["address"], s["total_size"]] for s in snapshot["segments"]]
    blocks = sorted([b["address"], b["size"]] for s in snapshot["segments"] for b in s["blocks"]
                    if b["state"] == "active_allocated")
    figures = stats()
    # What is still allocated once the program's own tensors are gone: what torch itself
    # keeps to its exit (2.6 and older never free their cuBLAS workspaces).
    del model, layer, optimizer, x
    s = torch.cuda.memory_stats()
    say(mode="trace", entries=entries, known=known, segments=segments, blocks=blocks, **figures,
        kept=[s["allocation.all.current"], s["allocated_bytes.all.current"]])


def profiled():
    """PyTorch's legacy profiler with memory on (its allocator reports each block to the profiler
    through c10::reportMemoryUsageToProfiler, which the shim interposes): each op's CUDA memory
    change, and the blocks of the tensors made, in order."""
    from torch.autograd.profiler_legacy import profile
    with profile(profile_memory=True, use_cuda=True) as prof:
        a = torch.empty(1000, 3, device="cuda")
        b = torch.empty(7, dtype=torch.uint8, device="cuda")
        c = torch.ones(5 << 20, device="cuda") + 1
        addresses = [a.data_ptr(), b.data_ptr(), c.data_ptr()]
        del a, c
    # Named device_memory_usage in later releases (2.15).
    say(mode="profiled", ops=[[e.name, e.cuda_memory_usage
                               if hasattr(e, "cuda_memory_usage") else e.device_memory_usage]
                              for e in prof.function_events],
        addresses=addresses, allocated_peak=torch.cuda.max_memory_allocated())


def snapshot():
    """PyTorch's own snapshot against vramshim's export of the same run: an MLP and a
    transformer training step under the default allocator with torch's history on, the cache
    emptied between them, one out-of-memory error (caught) and, last, torch's snapshot: its
    segments with their blocks, its whole trace, and its counters. It leaves with os._exit
    right after, so that nothing changes between torch's snapshot and the log's end."""
    import os
    start_history()
    failed = {}

    def fail_once():
        if not failed:
            try:
                torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
            except torch.cuda.OutOfMemoryError:  # torch 2.1 has no torch.OutOfMemoryError
                failed.update(allocated=torch.cuda.memory_allocated(),
                              reserved=torch.cuda.memory_reserved())

    # Live at the snapshot, as the program's own tensors.
    model, layer, optimizer, x = mlp_then_transformer(after_step=fail_once)  # noqa: F841
    kept = torch.empty(3000, device="cuda")  # noqa: F841 (live at the snapshot)
    pending = torch.empty(5000, device="cuda")
    side = torch.cuda.Stream()
    pending.record_stream(side)
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
    del pending
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    segments = [[s["address"], s["total_size"],
                 [[b["address"], b["size"], b["state"], b["requested_size"]] for b in s["blocks"]]]
                for s in snapshot["segments"] if s["device"] == 0]
    entries = [[e["action"], e.get("addr", e.get("device_free")), e["size"]]
               for e in snapshot["device_traces"][0]]
    say(mode="snapshot", segments=segments, entries=entries, failed=failed or None,
        allocated=torch.cuda.memory_allocated(), **stats())
    os._exit(0)


def two_devices():
    """One tensor on device 0, then two threads on each of two devices: 50 tensors per thread,
    every other one freed at once, the rest when the thread's work returns."""
    import threading

    def work(device):
        tensors = [torch.empty(1000 * (i + 1), device=f"cuda:{device}") for i in range(50)]
        del tensors[::2]

    # Device 0 first: PyTorch creates device 1's allocator later, on its first use.
    first = torch.empty(1, device="cuda:0")
    threads = [threading.Thread(target=work, args=(d,)) for d in (0, 1) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    per_device = [torch.cuda.memory_stats(d) for d in (0, 1)]
    say(mode="two_devices", count=torch.cuda.device_count(),
        allocations=[s["allocation.all.allocated"] for s in per_device],
        allocated_peaks=[s["allocated_bytes.all.peak"] for s in per_device])


def gemm():
    """A GEMM (cuBLAS) then a Linear with bias (cuBLASLt): torch's reserved bytes and the
    driver's used bytes before, after the first and after the second."""
    a = torch.randn(256, 256, device="cuda")
    before = (torch.cuda.memory_reserved(), used())
    b = a @ a
    torch.cuda.synchronize()
    after_gemm = (torch.cuda.memory_reserved(), used())
    c = torch.nn.Linear(256, 256).cuda()(a)
    torch.cuda.synchronize()
    after_linear = (torch.cuda.memory_reserved(), used())
    say(mode="gemm", before=before, gemm=after_gemm, linear=after_linear, **stats())


def visible():
    """The devices CUDA_VISIBLE_DEVICES leaves: torch's count before CUDA starts (its own reading
    of the variable over NVML's devices), the driver's count after, each device's UUID, and the
    OOM message on device 0 (its "this process has" figure comes from NVML, by PCI bus id)."""
    nvml_count = torch.cuda.device_count()
    available = torch.cuda.is_available()
    count, uuids, message = 0, [], None
    if available:
        torch.cuda.init()
        count = torch.cuda.device_count()
        uuids = [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]
        keep = torch.empty(600 * MiB, dtype=torch.uint8, device="cuda:0")
        try:
            torch.empty(600 * MiB, dtype=torch.uint8, device="cuda:0")
        except torch.OutOfMemoryError as error:
            message = str(error)
        del keep
    say(mode="visible", nvml_count=nvml_count, available=available, count=count, uuids=uuids,
        message=message)


def trace_crash():
    """trace(), then a crash (SIGSEGV): the recorder writes what it holds from its crash path."""
    trace()
    sys.stdout.flush()
    os.kill(os.getpid(), __import__("signal").SIGSEGV)


{"trace_crash": trace_crash, "caching": caching, "oom": oom, "expandable": expandable, "async": malloc_async,
 "train": train, "transformer": transformer, "gemm": gemm, "roundtrip": roundtrip,
 "trace": trace, "profiled": profiled, "two_devices": two_devices, "visible": visible, "snapshot": snapshot}[sys.argv[1]]()
