"""What cuFFT and cuSOLVER answer for their workspaces, as PyTorch asks them: cuFFT plans made
as torch makes them (cufftCreate, cufftSetAutoAllocation(plan, 0), cufftXtMakePlanMany) for a
set of transforms, and cuSOLVER's workspace queries (the legacy API's `*_bufferSize`, in
elements; the 64-bit API's device and host bytes) for the routines torch.linalg calls, at a
few orders, in float and double, plus the batched ones. With each plan and handle, the device
memory it took (cudaMemGetInfo's free bytes before and after; for cuSOLVER a second handle's
too, and what destroying it gave back). Run with the python of a CUDA
PyTorch: on a real GPU it asks NVIDIA's libraries, on the fake GPU the fakes (preload them as
tests/tests/common/torch.rs does), so the fakes' estimates can be compared line by line.
Prints one JSON object per query, then one naming the card.

usage: python scripts/cufft_cusolver_probe.py
"""
import ctypes
import json

import torch

# Load torch's cuFFT and cuSOLVER (torch_cuda_linalg is loaded at the first solver call).
torch.linalg.inv(torch.eye(2, device="cuda"))
torch.fft.fft(torch.zeros(4, device="cuda"))
torch.cuda.synchronize()


def library(*names):
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise OSError(f"none of {names} could be loaded")


cufft = library("libcufft.so.12", "libcufft.so.11")
cusolver = library("libcusolver.so.12", "libcusolver.so.11")
P, I64, SIZE = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t
R_32F, R_64F, C_32F, C_64F = 0, 1, 4, 5  # cudaDataType
LOWER, OP_T, SIDE_LEFT, VECTOR = 0, 1, 0, 1  # cuBLAS fill mode, operation, side; eig mode


def free_bytes():
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def emit(line):
    print(json.dumps(line), flush=True)


# ---------------------------------------------------------------- cuFFT
# (transform, signal sizes, batch): torch's fft, rfft2, irfft and stft shapes of the tests,
# then longer, odd-sized, 3-D and double precision transforms.
TRANSFORMS = [("c2c", [100], 32), ("r2c", [48, 64], 1), ("c2r", [128], 16), ("r2c", [400], 202),
              ("c2c", [4096], 1), ("c2c", [1000], 8), ("c2c", [32, 32, 32], 1),
              ("r2c", [512, 512], 4), ("z2z", [256], 64), ("d2z", [1024], 16)]
TYPES = {"c2c": (C_32F, C_32F, C_32F), "r2c": (R_32F, C_32F, C_32F), "c2r": (C_32F, R_32F, C_32F),
         "z2z": (C_64F, C_64F, C_64F), "d2z": (R_64F, C_64F, C_64F)}


def fft_probe(transform, sizes, batch):
    input_type, output_type, execution_type = TYPES[transform]
    plan = ctypes.c_int()
    line = {"lib": "cufft", "transform": transform, "n": sizes, "batch": batch}
    line["create"] = cufft.cufftCreate(ctypes.byref(plan))
    line["auto_allocation"] = cufft.cufftSetAutoAllocation(plan, 0)
    n = (ctypes.c_longlong * len(sizes))(*sizes)
    work = SIZE()
    before = free_bytes()
    line["status"] = cufft.cufftXtMakePlanMany(
        plan, len(sizes), n, None, ctypes.c_longlong(1), ctypes.c_longlong(0), input_type, None,
        ctypes.c_longlong(1), ctypes.c_longlong(0), output_type, ctypes.c_longlong(batch),
        ctypes.byref(work), execution_type)
    line["plan_bytes"] = before - free_bytes()
    line["work_size"] = work.value
    line["destroy"] = cufft.cufftDestroy(plan)
    emit(line)


for transform in TRANSFORMS:
    fft_probe(*transform)

# ---------------------------------------------------------------- cuSOLVER
handle = P()
before = free_bytes()
status = cusolver.cusolverDnCreate(ctypes.byref(handle))
handle_bytes = before - free_bytes()
# A second handle, then destroyed: whether each handle costs the same (its own allocations) or
# only the first (code loaded once), and what destroying one gives back.
second = P()
before = free_bytes()
second_status = cusolver.cusolverDnCreate(ctypes.byref(second))
second_bytes = before - free_bytes()
before = free_bytes()
destroy_status = cusolver.cusolverDnDestroy(second)
emit({"lib": "cusolver", "routine": "handle", "status": status, "handle_bytes": handle_bytes,
      "second_status": second_status, "second_handle_bytes": second_bytes,
      "destroy_status": destroy_status, "destroy_returned_bytes": free_bytes() - before})
params, gesvdj_info, syevj_info = P(), P(), P()
assert cusolver.cusolverDnCreateParams(ctypes.byref(params)) == 0
assert cusolver.cusolverDnCreateGesvdjInfo(ctypes.byref(gesvdj_info)) == 0
assert cusolver.cusolverDnCreateSyevjInfo(ctypes.byref(syevj_info)) == 0
# Device buffers large enough for every query (cuSOLVER may read the pointers' alignment).
space = torch.zeros(4 * 512 * 512 + 4096, dtype=torch.float64, device="cuda")
A = B = C = U = V = P(space.data_ptr())


def legacy(routine, prefix, m, n, batch, call):
    lwork = ctypes.c_int(-1)
    status = call(ctypes.byref(lwork))
    emit({"lib": "cusolver", "routine": routine, "type": prefix, "m": m, "n": n, "batch": batch,
          "status": status, "lwork": lwork.value})


def bytes64(routine, data_type, m, n, batch, call):
    device, host = SIZE(), SIZE()
    status = call(ctypes.byref(device), ctypes.byref(host))
    emit({"lib": "cusolver", "routine": routine, "data_type": data_type, "m": m, "n": n,
          "batch": batch, "status": status, "device": device.value, "host": host.value})


def fn(prefix, name):
    return getattr(cusolver, f"cusolverDn{prefix}{name}")


for order in (64, 96, 512):
    for prefix, data_type in (("S", R_32F), ("D", R_64F)):
        k = order
        legacy("getrf", prefix, k, k, 1,
               lambda lw: fn(prefix, "getrf_bufferSize")(handle, k, k, A, k, lw))
        legacy("potrf", prefix, k, k, 1,
               lambda lw: fn(prefix, "potrf_bufferSize")(handle, LOWER, k, A, k, lw))
        legacy("geqrf", prefix, k, k, 1,
               lambda lw: fn(prefix, "geqrf_bufferSize")(handle, k, k, A, k, lw))
        legacy("orgqr", prefix, k, k, 1,
               lambda lw: fn(prefix, "orgqr_bufferSize")(handle, k, k, k, A, k, B, lw))
        legacy("ormqr", prefix, k, k, 1,
               lambda lw: fn(prefix, "ormqr_bufferSize")(handle, SIDE_LEFT, OP_T, k, k, k, A, k,
                                                          B, C, k, lw))
        legacy("syevd", prefix, k, k, 1,
               lambda lw: fn(prefix, "syevd_bufferSize")(handle, VECTOR, LOWER, k, A, k, B, lw))
        legacy("gesvd", prefix, k, k, 1,
               lambda lw: fn(prefix, "gesvd_bufferSize")(handle, k, k, lw))
        legacy("gesvdj", prefix, k, k, 1,
               lambda lw: fn(prefix, "gesvdj_bufferSize")(handle, VECTOR, 0, k, k, A, k, B, U, k,
                                                           V, k, lw, gesvdj_info))
        bytes64("Xgetrf", data_type, k, k, 1,
                lambda d, h: cusolver.cusolverDnXgetrf_bufferSize(
                    handle, params, I64(k), I64(k), data_type, A, I64(k), data_type, d, h))
        bytes64("Xpotrf", data_type, k, k, 1,
                lambda d, h: cusolver.cusolverDnXpotrf_bufferSize(
                    handle, params, LOWER, I64(k), data_type, A, I64(k), data_type, d, h))
        bytes64("Xgeqrf", data_type, k, k, 1,
                lambda d, h: cusolver.cusolverDnXgeqrf_bufferSize(
                    handle, params, I64(k), I64(k), data_type, A, I64(k), data_type, B,
                    data_type, d, h))
        bytes64("Xsyevd", data_type, k, k, 1,
                lambda d, h: cusolver.cusolverDnXsyevd_bufferSize(
                    handle, params, VECTOR, LOWER, I64(k), data_type, A, I64(k), data_type, B,
                    data_type, d, h))

# The batched routines, as torch calls them for batches of small matrices.
SMALL, BATCH = 16, 4
for prefix, data_type in (("S", R_32F), ("D", R_64F)):
    k = SMALL
    legacy("gesvdjBatched", prefix, k, k, BATCH,
           lambda lw: fn(prefix, "gesvdjBatched_bufferSize")(handle, VECTOR, k, k, A, k, B, U, k,
                                                              V, k, lw, gesvdj_info, BATCH))
    legacy("gesvdaStridedBatched", prefix, k, k, BATCH,
           lambda lw: fn(prefix, "gesvdaStridedBatched_bufferSize")(
               handle, VECTOR, k, k, k, A, k, ctypes.c_longlong(k * k), B, ctypes.c_longlong(k),
               U, k, ctypes.c_longlong(k * k), V, k, ctypes.c_longlong(k * k), lw, BATCH))
    legacy("syevjBatched", prefix, k, k, BATCH,
           lambda lw: fn(prefix, "syevjBatched_bufferSize")(handle, VECTOR, LOWER, k, A, k, B, lw,
                                                             syevj_info, BATCH))
    if hasattr(cusolver, "cusolverDnXsyevBatched_bufferSize"):
        bytes64("XsyevBatched", data_type, k, k, BATCH,
                lambda d, h: cusolver.cusolverDnXsyevBatched_bufferSize(
                    handle, params, VECTOR, LOWER, I64(k), data_type, A, I64(k), data_type, B,
                    data_type, d, h, I64(BATCH)))

cusolver.cusolverDnDestroySyevjInfo(syevj_info)
cusolver.cusolverDnDestroyGesvdjInfo(gesvdj_info)
cusolver.cusolverDnDestroyParams(params)
cusolver.cusolverDnDestroy(handle)
props = torch.cuda.get_device_properties(0)
emit({"name": "card", "gpu": props.name, "sms": props.multi_processor_count,
      "cuda": torch.version.cuda, "torch": torch.__version__})
