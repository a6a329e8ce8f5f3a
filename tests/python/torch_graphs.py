"""CUDA graphs of real PyTorch on the fake GPU (tests/tests/fakegpu_torch.rs). One mode per run
(argv[1]); prints one JSON object as its last line.

graph: a small model captured with torch.cuda.graph after a warm-up on a side stream, and a
copy of a static input into a static output captured with it; the output read back after the
capture and after each replay (the fakes compute nothing, but they copy: a replay copies the
input of that moment), torch's memory figures and the captured graph's node count.
reduce-overhead: torch.compile(mode="reduce-overhead") of a small model, run until its CUDA
graph replays; with inductor's counters.
async-graph: under backend:cudaMallocAsync, a small model captured and replayed twice, then the
graph pool trimmed (cudaDeviceGraphMemTrim); the device's used bytes (cudaMemGetInfo) at each
step.
private-pool: a model captured by torch.cuda.graph (warm-up on a side stream, capture, three
replays), then eager work on the default stream with the graph alive; torch's memory_stats()
figures (the native allocator's private pool, or graph memory nodes under cudaMallocAsync).
With JUDGE_FRACTION=F torch.cuda.set_per_process_memory_fraction(F) first, and an OOM of the
eager work is caught ("failed": its message's first line).
shared-pool: two graphs captured into one private pool (torch.cuda.graph(pool=...)), replayed,
then the same eager work; memory_stats() figures.
nested: a graph replayed inside another graph's capture (torch.cuda.graph around
inner.replay()): the outer graph's node types, its child graph's, the copies' results after the
capture and after an outer replay, the device's used bytes (cudaMemGetInfo) and the graph pool's
attributes (cudaDeviceGetGraphMemAttribute) before and after that replay.
graphed-callables: make_graphed_callables of the same model (forward and backward graphs in one
shared private pool), three training steps, then the same eager work; memory_stats() figures
(whatif overstates them: it gives each capture a pool of its own, see README)."""
import ctypes
import json
import os
import sys
import warnings

import torch
from torch import nn


def stats():
    s = torch.cuda.memory_stats()
    return {key.replace(".all", "").replace(".", "_"): s.get(key, 0) for key in (
        "num_alloc_retries", "num_ooms", "reserved_bytes.all.peak", "allocated_bytes.all.peak",
        "reserved_bytes.all.current", "allocated_bytes.all.current", "segment.all.current",
        "num_device_alloc", "num_device_free")}


def used():
    free, total = torch.cuda.mem_get_info()
    return total - free


def graph_nodes(graph):
    """cudaGraphGetNodes of the captured graph, through the runtime torch loaded."""
    runtime = ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0])
    count = ctypes.c_size_t(0)
    rc = runtime.cudaGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(count))
    return rc, count.value


def captured():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).cuda()
    static_x = torch.randn(16, 64).cuda()
    static_in = torch.arange(1024, dtype=torch.float32).cuda()
    static_copy = torch.zeros(1024).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    before = stats()
    try:
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        kept = True
    except TypeError:
        graph = torch.cuda.CUDAGraph()
        kept = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.cuda.graph(graph):
            static_out = model(static_x)
            static_copy.copy_(static_in)
    empty_warnings = sum("empty" in str(w.message) for w in caught)
    # The same warning counted for a capture of nothing: it says "The CUDA Graph is empty".
    with warnings.catch_warnings(record=True) as caught_nothing:
        warnings.simplefilter("always")
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            pass
    empty_capture_warnings = sum("empty" in str(w.message) for w in caught_nothing)
    after_capture = stats()
    nodes = graph_nodes(graph.raw_cuda_graph()) if kept else None
    copy_after_capture = static_copy.cpu().sum().item()
    replays = []
    for value in (2.0, 3.0):
        static_in.copy_(torch.full((1024,), value))
        graph.replay()
        torch.cuda.synchronize()
        replays.append(static_copy.cpu().sum().item())
    print(json.dumps({"mode": "graph", "nodes": nodes, "empty_warnings": empty_warnings,
                      "empty_capture_warnings": empty_capture_warnings,
                      "copy_after_capture": copy_after_capture, "replays": replays,
                      "out_shape": list(static_out.shape), "before": before,
                      "after_capture": after_capture, "used": used(), **stats()}))


def reduce_overhead():
    from torch._dynamo.utils import counters
    from torch._inductor import cudagraph_trees
    replays = [0]
    replay = torch.cuda.CUDAGraph.replay

    def counted_replay(graph):
        replays[0] += 1
        return replay(graph)

    torch.cuda.CUDAGraph.replay = counted_replay
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 10)).cuda()
    compiled = torch.compile(model, mode="reduce-overhead")
    inputs = torch.randn(32, 256).cuda()
    with torch.no_grad():
        for _ in range(4):
            out = compiled(inputs)
    torch.cuda.synchronize()
    manager = cudagraph_trees.get_manager(0, create_if_none_exists=False)
    recorded = sum(len(nodes) for nodes in manager.roots.values()) if manager else 0
    print(json.dumps({"mode": "reduce-overhead", "out_shape": list(out.shape),
                      "recorded_graphs": recorded, "replays": replays[0],
                      "graphs": counters["stats"]["unique_graphs"],
                      "inductor": {k: v for k, v in counters["inductor"].items()
                                   if "cudagraph" in k},
                      "used": used(), **stats()}))


def async_graph():
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32)).cuda()
    static_x = torch.randn(16, 64).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    before_capture = used()
    with torch.cuda.graph(graph):
        static_out = model(static_x)
    after_capture = used()
    replays = []
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        replays.append(used())
    del static_out
    graph.reset()
    torch.cuda.synchronize()
    after_reset = used()
    runtime = ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0])
    trim = runtime.cudaDeviceGraphMemTrim(0)
    print(json.dumps({"mode": "async-graph", "backend": torch.cuda.get_allocator_backend(),
                      "before_capture": before_capture, "after_capture": after_capture,
                      "replays": replays, "after_reset": after_reset, "trim": trim,
                      "after_trim": used()}))


def shared_pool():
    """Two graphs captured into one private pool (torch.cuda.graph(pool=...)): the model's
    forward, then its forward on twice the rows; each replayed, then the eager work."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    small = torch.randn(512, 1024).cuda()
    large = torch.randn(1024, 1024).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(small)
            model(large)
    torch.cuda.current_stream().wait_stream(side)
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(first):
        out_small = model(small)
    # The second capture may take the blocks the first one freed (its intermediates).
    with torch.cuda.graph(second, pool=first.pool()):
        out_large = model(large)
    for graph in (first, second, first, second):
        graph.replay()
    torch.cuda.synchronize()
    del out_small  # freed back into the pool (outside its graph, after a launch)
    for rows in (512, 2048, 1024):
        out = model(torch.randn(rows, 1024, device="cuda"))
        del out
    torch.cuda.synchronize()
    print(json.dumps({"mode": "shared-pool", "backend": torch.cuda.get_allocator_backend(),
                      "out_shape": list(out_large.shape), **figures()}))


def private_pool():
    if os.environ.get("JUDGE_FRACTION"):
        torch.cuda.set_per_process_memory_fraction(float(os.environ["JUDGE_FRACTION"]))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    static_x = torch.randn(512, 1024).cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = model(static_x)  # kept alive: its block stays allocated in the pool
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    after_replays = figures()
    # Eager work with the graph alive: the model again, bigger activations, on the default
    # stream (the private pool's cached blocks are not its to take).
    failed = None
    try:
        for rows in (512, 2048, 1024):
            out = model(torch.randn(rows, 1024, device="cuda"))
            del out
    except torch.OutOfMemoryError as e:
        failed = str(e).split("\n")[0]
    torch.cuda.synchronize()
    print(json.dumps({"mode": "private-pool", "backend": torch.cuda.get_allocator_backend(),
                      "failed": failed, "out_shape": list(static_out.shape),
                      "after_replays": after_replays, **figures()}))


def graphed_callables():
    """make_graphed_callables of a model: its forward and backward graphs share one private
    pool; three training steps through them, then the same eager work as private-pool."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).cuda()
    x = torch.randn(512, 1024, device="cuda")
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    for _ in range(3):
        graphed(x).sum().backward()
    torch.cuda.synchronize()
    # The module's forward is the graphed one now: the eager work goes through its weights.
    first, second = model[0], model[2]
    for rows in (512, 2048, 1024):
        hidden = nn.functional.relu(first(torch.randn(rows, 1024, device="cuda")))
        out = nn.functional.linear(hidden, second.weight, second.bias)
        del hidden, out
    torch.cuda.synchronize()
    print(json.dumps({"mode": "graphed-callables", "backend": torch.cuda.get_allocator_backend(),
                      **figures()}))


def node_types(graph):
    """The node types of a cudaGraph_t (cudaGraphGetNodes, cudaGraphNodeGetType) and the
    handles of its nodes."""
    runtime = ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0])
    count = ctypes.c_size_t(0)
    runtime.cudaGraphGetNodes(ctypes.c_void_p(graph), None, ctypes.byref(count))
    handles = (ctypes.c_void_p * count.value)()
    runtime.cudaGraphGetNodes(ctypes.c_void_p(graph), handles, ctypes.byref(count))
    types = []
    for handle in handles:
        kind = ctypes.c_int(-1)
        runtime.cudaGraphNodeGetType(ctypes.c_void_p(handle), ctypes.byref(kind))
        types.append(kind.value)
    return types, list(handles)


def graph_pool():
    """The graph pool's used, used-high, reserved and reserved-high bytes on device 0."""
    runtime = ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0])
    values = []
    for attribute in range(4):
        value = ctypes.c_ulonglong(0)
        runtime.cudaDeviceGetGraphMemAttribute(0, attribute, ctypes.byref(value))
        values.append(value.value)
    return values


def nested():
    """inner: x + 1 (a kernel, its result freed in the capture) and a copy of the static input;
    outer: inner.replay() and a copy of inner's output."""
    runtime = ctypes.CDLL("libcudart.so." + torch.version.cuda.split(".")[0])
    static_in = torch.arange(1024, dtype=torch.float32, device="cuda")
    static_copy = torch.zeros(1024, device="cuda")
    outer_copy = torch.zeros(1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            static_in + 1
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    inner, outer = torch.cuda.CUDAGraph(keep_graph=True), torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(inner):
        tmp = static_in + 1
        static_copy.copy_(static_in)
        del tmp
    with torch.cuda.graph(outer):
        inner.replay()
        outer_copy.copy_(static_copy)
    inner_types, _ = node_types(inner.raw_cuda_graph())
    outer_types, handles = node_types(outer.raw_cuda_graph())
    child = ctypes.c_void_p(0)
    child_rc = runtime.cudaGraphChildGraphNodeGetGraph(ctypes.c_void_p(handles[0]),
                                                       ctypes.byref(child))
    child_types, _ = node_types(child.value)
    # Summed on the host: the fakes run no kernel, so only copies move data.
    after_capture = [static_copy.cpu().sum().item(), outer_copy.cpu().sum().item()]
    static_in.copy_(torch.full((1024,), 2.0))  # a host-to-device copy: done, unlike a fill
    torch.cuda.synchronize()
    before_replay, pool_before, stats_before = used(), graph_pool(), stats()
    outer.replay()
    torch.cuda.synchronize()
    print(json.dumps({"mode": "nested", "backend": torch.cuda.get_allocator_backend(),
                      "inner_types": inner_types, "outer_types": outer_types,
                      "child_rc": child_rc, "child_types": child_types,
                      "after_capture": after_capture,
                      "after_replay": [static_copy.cpu().sum().item(),
                                       outer_copy.cpu().sum().item()],
                      "used_before_replay": before_replay, "used_after_replay": used(),
                      "pool_before_replay": pool_before, "pool_after_replay": graph_pool(),
                      "before_replay": stats_before, **stats()}))


def figures():
    s = torch.cuda.memory_stats()
    keys = ["reserved_bytes.all.peak", "allocated_bytes.all.peak", "requested_bytes.all.peak",
            "reserved_bytes.all.current", "num_device_alloc", "num_device_free",
            "num_alloc_retries", "num_ooms"]
    out = {key: s.get(key, 0) for key in keys}
    out["max_memory_reserved"] = torch.cuda.max_memory_reserved()
    return out


{"graph": captured, "private-pool": private_pool, "shared-pool": shared_pool, "graphed-callables": graphed_callables, "reduce-overhead": reduce_overhead,
 "async-graph": async_graph, "nested": nested}[sys.argv[1]]()
sys.stdout.flush()
os._exit(0)
