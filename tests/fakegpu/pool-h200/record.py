"""The real default memory pool under a pseudo-random cudaMallocAsync/cudaFreeAsync sequence:
each call's address and the pool's reserved/used current/high after it (JSON lines)."""
import ctypes, glob, json, random, sys
import torch  # only to find the CUDA 13 runtime torch ships
lib = glob.glob("/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13*")
rt = ctypes.CDLL(lib[0] if lib else "libcudart.so.13")
def ck(s, what):
    if s: raise SystemExit(f"{what}: {s}")
pool = ctypes.c_void_p()
ck(rt.cudaDeviceGetDefaultMemPool(ctypes.byref(pool), 0), "pool")
threshold = int(sys.argv[2]) if len(sys.argv) > 2 else (1 << 64) - 1
v = ctypes.c_uint64(threshold)
ck(rt.cudaMemPoolSetAttribute(pool, 4, ctypes.byref(v)), "threshold")  # ReleaseThreshold
def attr(a):
    x = ctypes.c_uint64(); ck(rt.cudaMemPoolGetAttribute(pool, a, ctypes.byref(x)), "attr"); return x.value
# cudaMemPoolAttrReservedMemCurrent 5, ReservedMemHigh 6, UsedMemCurrent 7, UsedMemHigh 8
rng = random.Random(int(sys.argv[1]))
live = []
sizes = [4, 100, 512, 513, 2048, 8192, 65536, 524288, 1 << 20, 2 << 20, 3 << 20, 8 << 20, 20 << 20, 32 << 20, 33 << 20, 64 << 20, 100 << 20]
out = open(sys.argv[3], "w")
for i in range(int(sys.argv[4]) if len(sys.argv) > 4 else 1500):
    op = {}
    if live and (rng.random() < 0.45 or len(live) > 60):
        p = live.pop(rng.randrange(len(live)))
        ck(rt.cudaFreeAsync(ctypes.c_void_p(p), None), "free"); op = {"op": "free", "addr": p}
    elif i % 97 == 96:
        ck(rt.cudaDeviceSynchronize(), "sync"); op = {"op": "sync"}
    elif i % 251 == 250:
        ck(rt.cudaMemPoolTrimTo(pool, ctypes.c_size_t(0)), "trim"); op = {"op": "trim"}
    else:
        size = rng.choice(sizes) if rng.random() < 0.7 else rng.randrange(1, 48 << 20)
        p = ctypes.c_void_p()
        ck(rt.cudaMallocAsync(ctypes.byref(p), ctypes.c_size_t(size), None), "malloc")
        live.append(p.value); op = {"op": "alloc", "size": size, "addr": p.value}
    op.update(rc=attr(5), rh=attr(6), uc=attr(7), uh=attr(8))
    out.write(json.dumps(op) + "\n")
out.close()
print("pool", sys.argv[1:], "ok")
