"""What PyTorch and an nvidia-smi-like NVML query see on a MIG device (`vramshim dryrun --mig`,
tests/tests/fakegpu_torch.rs): one JSON line of figures (with every GPU's MIG devices, their
GPU instance ids and the processes on each), then an allocation larger than the slice, which
fails with torch's OutOfMemoryError (its message printed on the last line)."""

import ctypes
import json

import torch


def nvml_view():
    """The GPUs NVML lists, their MIG mode and their MIG device 0, as nvidia-smi -L would."""
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    assert nvml.nvmlInit_v2() == 0
    count = ctypes.c_uint()
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0

    class Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                    ("used", ctypes.c_ulonglong)]

    def describe(handle):
        name = ctypes.create_string_buffer(96)
        uuid = ctypes.create_string_buffer(96)
        memory = Memory()
        assert nvml.nvmlDeviceGetName(handle, name, 96) == 0
        assert nvml.nvmlDeviceGetUUID(handle, uuid, 96) == 0
        assert nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0
        return {"name": name.value.decode(), "uuid": uuid.value.decode(),
                "total": memory.total, "used": memory.used}

    class Process(ctypes.Structure):
        _fields_ = [("pid", ctypes.c_uint), ("used", ctypes.c_ulonglong),
                    ("gpu_instance", ctypes.c_uint), ("compute_instance", ctypes.c_uint)]

    def processes(handle):
        """[used bytes, GPU instance id, compute instance id] of each process (this one)."""
        entries = (Process * 8)()
        n = ctypes.c_uint(8)
        assert nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(n), entries) == 0
        return [[e.used, e.gpu_instance, e.compute_instance] for e in entries[:n.value]]

    gpus = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        assert nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
        gpu = describe(handle)
        current, pending, most = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint()
        assert nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)) == 0
        assert nvml.nvmlDeviceGetMaxMigDeviceCount(handle, ctypes.byref(most)) == 0
        gpu["mig_mode"] = [current.value, pending.value]
        gpu["max_mig_devices"] = most.value
        gpu["mig_devices"] = []
        for mig_index in range(most.value):
            mig = ctypes.c_void_p()
            if nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index, ctypes.byref(mig)):
                continue
            is_mig = ctypes.c_uint()
            assert nvml.nvmlDeviceIsMigDeviceHandle(mig, ctypes.byref(is_mig)) == 0
            gpu_instance = ctypes.c_uint()
            assert nvml.nvmlDeviceGetGpuInstanceId(mig, ctypes.byref(gpu_instance)) == 0
            device = describe(mig)
            device["index"] = mig_index
            device["is_mig"] = is_mig.value
            device["gpu_instance"] = gpu_instance.value
            device["processes"] = processes(mig)
            gpu["mig_devices"].append(device)
        gpus.append(gpu)
    return gpus


free_before, total = torch.cuda.mem_get_info()
props = torch.cuda.get_device_properties(0)
weights = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
free_after, _ = torch.cuda.mem_get_info()
print(json.dumps({
    "device_count": torch.cuda.device_count(),
    "name": props.name,
    "total_memory": props.total_memory,
    "sms": props.multi_processor_count,
    "uuid": str(props.uuid),
    "mem_get_info_total": total,
    "taken_by_one_gib": free_before - free_after,
    "reserved": torch.cuda.memory_reserved(),
    "nvml": nvml_view(),
}), flush=True)
try:
    torch.empty(total, dtype=torch.uint8, device="cuda")
except torch.OutOfMemoryError as error:
    print(str(error).splitlines()[0], flush=True)
