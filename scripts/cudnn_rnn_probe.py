"""What cuDNN's RNN API answers for a set of recurrent networks: the weight space's size, where
each gate's matrix and bias lie in it (pseudo-layers 0 and last), the work and reserve spaces
for training and inference, dropout's state size and a dropout reserve. Run with the python of
a CUDA PyTorch: on a real GPU it asks the libcudnn.so.9 torch loaded (NVIDIA's), on the fake
GPU the fake (preload it as tests/tests/common/torch.rs does), so the two can be compared line
by line. Prints one JSON object per network, then one for dropout.

usage: python scripts/cudnn_rnn_probe.py
"""
import ctypes
import json

import torch

torch.zeros(1, device="cuda")  # the context, and torch's cuDNN loaded
cudnn = ctypes.CDLL("libcudnn.so.9")
handle = ctypes.c_void_p()
assert cudnn.cudnnCreate(ctypes.byref(handle)) == 0
P = ctypes.c_void_p

# (name, cell mode, bidirectional, input, hidden, projection, layers, data type, algo, steps,
# batch): cell modes RNN_RELU 0, RNN_TANH 1, LSTM 2, GRU 3; data types FLOAT 0, HALF 2; algo
# STANDARD 0, PERSIST_STATIC_SMALL_H 3.
NETWORKS = [
    ("lstm_test", 2, 0, 256, 512, 512, 2, 0, 0, 100, 8),
    ("lstm_steps", 2, 0, 256, 512, 512, 2, 0, 0, 200, 8),
    ("lstm_batch", 2, 0, 256, 512, 512, 2, 0, 0, 100, 16),
    ("lstm_hidden", 2, 0, 256, 1024, 1024, 2, 0, 0, 100, 8),
    ("lstm_layers", 2, 0, 256, 512, 512, 4, 0, 0, 100, 8),
    ("lstm_input", 2, 0, 1024, 512, 512, 2, 0, 0, 100, 8),
    ("lstm_small_h", 2, 0, 64, 128, 128, 1, 0, 3, 50, 16),
    ("lstm_half", 2, 0, 256, 512, 512, 1, 2, 0, 100, 32),
    ("lstm_bi", 2, 1, 128, 256, 256, 2, 0, 0, 20, 4),
    ("lstm_proj", 2, 0, 128, 256, 64, 2, 0, 0, 20, 4),
    ("gru_bi", 3, 1, 128, 256, 256, 2, 0, 0, 20, 4),
    ("tanh", 1, 0, 32, 64, 64, 3, 0, 0, 10, 2),
]


def tensor_dims(descriptor):
    data_type, dims = ctypes.c_int(), ctypes.c_int()
    dim, stride = (ctypes.c_int * 8)(), (ctypes.c_int * 8)()
    rc = cudnn.cudnnGetTensorNdDescriptor(descriptor, 8, ctypes.byref(data_type),
                                          ctypes.byref(dims), dim, stride)
    return [rc, list(dim[:dims.value])]


def probe(name, mode, bidirectional, inputs, hidden, projection, layers, data_type, algo, steps,
          batch):
    result = {"name": name}
    rnn = P()
    cudnn.cudnnCreateRNNDescriptor(ctypes.byref(rnn))
    dropout = P()
    cudnn.cudnnCreateDropoutDescriptor(ctypes.byref(dropout))
    result["dropout_set"] = cudnn.cudnnSetDropoutDescriptor(
        dropout, handle, ctypes.c_float(0.0), None, ctypes.c_size_t(0), ctypes.c_ulonglong(0))
    math = 0  # CUDNN_DEFAULT_MATH
    result["set"] = cudnn.cudnnSetRNNDescriptor_v8(
        rnn, algo, mode, 2, bidirectional, 0, data_type, 0, math, inputs, hidden, projection,
        layers, dropout, 1)  # DOUBLE_BIAS, LINEAR_INPUT, math in float, PADDED_IO_ENABLED
    weight_bytes = ctypes.c_size_t()
    result["weight_rc"] = cudnn.cudnnGetRNNWeightSpaceSize(handle, rnn, ctypes.byref(weight_bytes))
    result["weight_bytes"] = weight_bytes.value
    base = torch.empty(max(weight_bytes.value, 1), dtype=torch.uint8, device="cuda")
    gates = {2: 4, 3: 3}.get(mode, 1)
    ids = 2 * gates + (1 if mode == 2 and projection < hidden else 0)
    params = []
    last = layers * (2 if bidirectional else 1) - 1
    for layer in sorted({0, last}):
        for linear in range(ids):
            m, b = P(), P()
            md, bd = P(), P()
            cudnn.cudnnCreateTensorDescriptor(ctypes.byref(md))
            cudnn.cudnnCreateTensorDescriptor(ctypes.byref(bd))
            rc = cudnn.cudnnGetRNNWeightParams(handle, rnn, layer,
                                               ctypes.c_size_t(weight_bytes.value),
                                               P(base.data_ptr()), linear, md, ctypes.byref(m),
                                               bd, ctypes.byref(b))
            offset = lambda p: None if not p.value else p.value - base.data_ptr()
            params.append([layer, linear, rc, offset(m), tensor_dims(md), offset(b),
                           tensor_dims(bd)])
    result["params"] = params
    x = P()
    cudnn.cudnnCreateRNNDataDescriptor(ctypes.byref(x))
    lengths = (ctypes.c_int * batch)(*([steps] * batch))
    result["data_set"] = cudnn.cudnnSetRNNDataDescriptor(x, data_type, 0, steps, batch, inputs,
                                                         lengths, None)
    for label, fwd in (("training", 1), ("inference", 0)):
        work, reserve = ctypes.c_size_t(), ctypes.c_size_t()
        rc = cudnn.cudnnGetRNNTempSpaceSizes(handle, rnn, fwd, x, ctypes.byref(work),
                                             ctypes.byref(reserve))
        result[label] = [rc, work.value, reserve.value]
    print(json.dumps(result), flush=True)


for network in NETWORKS:
    probe(*network)

states = ctypes.c_size_t()
rc = cudnn.cudnnDropoutGetStatesSize(handle, ctypes.byref(states))
tensor = P()
cudnn.cudnnCreateTensorDescriptor(ctypes.byref(tensor))
dims = (ctypes.c_int * 4)(1, 1, 1000, 1000)
cudnn.cudnnSetTensor4dDescriptor(tensor, 0, 0, 1, 1, 1000, 1000)
reserve = ctypes.c_size_t()
reserve_rc = cudnn.cudnnDropoutGetReserveSpaceSize(tensor, ctypes.byref(reserve))
props = torch.cuda.get_device_properties(0)
print(json.dumps({"name": "dropout", "states_rc": rc, "states": states.value,
                  "reserve_rc": reserve_rc, "reserve_1e6_floats": reserve.value,
                  "gpu": props.name, "sms": props.multi_processor_count,
                  "cudnn": torch.backends.cudnn.version(), "torch": torch.__version__}))
