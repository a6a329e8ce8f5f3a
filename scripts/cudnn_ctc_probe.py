"""What cuDNN answers for the CTC loss's workspace, as PyTorch asks it: cudnnGetCTCLossWorkspaceSize
(labels on the host, descriptor set with cudnnSetCTCLossDescriptorEx) and
cudnnGetCTCLossWorkspaceSize_v8 (descriptor set with _v9, or _v8 on cuDNN 8, and a longest
label of 255, as torch sets it), for both algorithms and a set of shapes (steps, batch, classes,
label length). Run with the python of a CUDA PyTorch: on a real GPU it asks NVIDIA's
libcudnn.so.9, on the fake GPU the fake (preload it as tests/tests/common/torch.rs does), so the
fake's estimate can be compared line by line. Prints one JSON object per shape, then one naming
the card.

usage: python scripts/cudnn_ctc_probe.py
"""
import ctypes
import json

import torch

torch.zeros(1, device="cuda")  # the context, and torch's cuDNN loaded
cudnn = ctypes.CDLL("libcudnn.so.9")
handle = ctypes.c_void_p()
assert cudnn.cudnnCreate(ctypes.byref(handle)) == 0
P = ctypes.c_void_p
FLOAT, SOFTMAX, PROPAGATE_NAN = 0, 1, 1  # cudnnDataType_t, normalisation, NaN mode
ALGOS = (("deterministic", 0), ("non_deterministic", 1))

# (steps T, batch N, classes A, label length L)
SHAPES = [(64, 16, 32, 12), (64, 16, 32, 1), (64, 16, 32, 50), (128, 16, 32, 12),
          (64, 32, 32, 12), (64, 16, 128, 12), (200, 8, 29, 100), (500, 32, 1000, 120)]


def tensor(dims):
    descriptor = P()
    cudnn.cudnnCreateTensorDescriptor(ctypes.byref(descriptor))
    dim = (ctypes.c_int * 3)(*dims)
    stride = (ctypes.c_int * 3)(dims[1] * dims[2], dims[2], 1)
    rc = cudnn.cudnnSetTensorNdDescriptor(descriptor, FLOAT, 3, dim, stride)
    assert rc == 0, rc
    return descriptor


def probe(steps, batch, classes, label):
    result = {"shape": [steps, batch, classes, label]}
    probs, grads = tensor((steps, batch, classes)), tensor((steps, batch, classes))
    labels = (ctypes.c_int * (batch * label))(*([1] * (batch * label)))
    label_lengths = (ctypes.c_int * batch)(*([label] * batch))
    input_lengths = (ctypes.c_int * batch)(*([steps] * batch))
    legacy, v8 = P(), P()
    cudnn.cudnnCreateCTCLossDescriptor(ctypes.byref(legacy))
    cudnn.cudnnCreateCTCLossDescriptor(ctypes.byref(v8))
    result["set_ex"] = cudnn.cudnnSetCTCLossDescriptorEx(legacy, FLOAT, SOFTMAX, PROPAGATE_NAN)
    set_v9 = getattr(cudnn, "cudnnSetCTCLossDescriptor_v9", None)
    setter = set_v9 or cudnn.cudnnSetCTCLossDescriptor_v8
    result["set_v8_v9"] = setter(v8, FLOAT, SOFTMAX, PROPAGATE_NAN, 255)
    for name, algo in ALGOS:
        size = ctypes.c_size_t()
        rc = cudnn.cudnnGetCTCLossWorkspaceSize(handle, probs, grads, labels, label_lengths,
                                                input_lengths, algo, legacy, ctypes.byref(size))
        result[f"legacy_{name}"] = [rc, size.value]
        size = ctypes.c_size_t()
        rc = cudnn.cudnnGetCTCLossWorkspaceSize_v8(handle, algo, v8, probs, grads,
                                                   ctypes.byref(size))
        result[f"v8_{name}"] = [rc, size.value]
    print(json.dumps(result), flush=True)


for shape in SHAPES:
    probe(*shape)

props = torch.cuda.get_device_properties(0)
print(json.dumps({"name": "card", "gpu": props.name, "sms": props.multi_processor_count,
                  "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__}))
