"""Real PyTorch's torch.fft, torch.stft and torch.linalg on the fake cuFFT and cuSOLVER
(tests/tests/fakegpu_torch.rs). Each op runs under torch's own memory history: the op's output
shapes and the sizes torch allocated during it, in order (the plans' and solvers' workspaces
among them, which torch takes from its caching allocator). Prints one JSON object as its last
line."""
import json
import os
import sys

import torch

from torch_figures import stats  # this folder is on sys.path


N = 96  # the matrices' order (not the estimates' block size, 64: workspaces differ from matrices)
FFT_ROWS, FFT_LENGTH = 32, 100  # fft: 32 signals of 100 samples
RFFT2_SHAPE = (48, 64)  # rfft2: one 48 x 64 image
IRFFT_ROWS, IRFFT_LENGTH = 16, 128  # irfft: 16 signals of 128 samples
# stft as an audio front end takes it (Whisper's log-mel): 2 clips of one second at 16 kHz,
# 25 ms windows (400 samples) every 10 ms (160), centred (reflect padding of 200 each side).
STFT_CLIPS, STFT_SAMPLES, STFT_WINDOW, STFT_HOP = 2, 16000, 400, 160
# A batch of small matrices: torch's batched paths (cuSOLVER's batched routines and cuBLAS's
# batched solvers).
BATCH, SMALL = 4, 16


def traced(op):
    """Runs op under torch's memory history: (its result, the sizes allocated during it)."""
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    result = op()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    allocations = [e["size"] for e in snapshot["device_traces"][0] if e["action"] == "alloc"]
    return result, allocations


def shapes(result):
    if isinstance(result, torch.Tensor):
        return list(result.shape)
    return [shapes(part) for part in result]


def main():
    torch.manual_seed(0)
    a = torch.randn(N, N, device="cuda")
    spd = torch.eye(N, device="cuda") * N  # symmetric positive definite, for cholesky
    signal = torch.randn(FFT_ROWS, FFT_LENGTH, device="cuda")
    image = torch.randn(*RFFT2_SHAPE, device="cuda")
    spectrum = torch.fft.rfft(torch.randn(IRFFT_ROWS, IRFFT_LENGTH, device="cuda"))
    audio = torch.randn(STFT_CLIPS, STFT_SAMPLES, device="cuda")
    window = torch.hann_window(STFT_WINDOW, device="cuda")
    small = torch.randn(BATCH, SMALL, SMALL, device="cuda")
    small_spd = (torch.eye(SMALL, device="cuda") * SMALL).expand(BATCH, SMALL, SMALL)
    ops = {
        "fft": lambda: torch.fft.fft(signal),
        "rfft2": lambda: torch.fft.rfft2(image),
        "irfft": lambda: torch.fft.irfft(spectrum),
        "stft": lambda: torch.stft(audio, STFT_WINDOW, STFT_HOP, window=window,
                                   return_complex=True),
        "inv": lambda: torch.linalg.inv(a),
        "solve": lambda: torch.linalg.solve(a, a),
        "det": lambda: torch.linalg.det(a),
        "cholesky": lambda: torch.linalg.cholesky(spd),
        "qr": lambda: torch.linalg.qr(a),
        "lstsq": lambda: torch.linalg.lstsq(a, a).solution,
        "eigh": lambda: torch.linalg.eigh(spd),
        "svd": lambda: torch.linalg.svd(a),
        "inv_batched": lambda: torch.linalg.inv(small),
        "cholesky_batched": lambda: torch.linalg.cholesky(small_spd),
        "qr_batched": lambda: torch.linalg.qr(small),
        "eigh_batched": lambda: torch.linalg.eigh(small_spd),
        "svd_batched": lambda: torch.linalg.svd(small),
    }
    results = {}
    for name, op in ops.items():
        result, allocations = traced(op)
        results[name] = {"shape": shapes(result), "allocations": allocations}
        del result
    # The info outputs that torch reads back: given through out= holding -7 (a copy from the
    # host, which carries its value on the fake GPU), each must read 0 after the call.
    infos = {}
    for name, op, outputs in (
            ("cholesky_ex", torch.linalg.cholesky_ex, lambda: (torch.empty_like(spd),)),
            ("inv_ex", torch.linalg.inv_ex, lambda: (torch.empty_like(a),)),
            ("lu_factor_ex", torch.linalg.lu_factor_ex,
             lambda: (torch.empty_like(a), torch.empty(N, dtype=torch.int32, device="cuda")))):
        info = torch.tensor(-7, dtype=torch.int32).cuda()
        before = info.item()
        op(spd if name == "cholesky_ex" else a, out=(*outputs(), info))
        infos[name] = [before, info.item()]
    print(json.dumps({"ops": results, "infos": infos, **stats()}))


main()
sys.stdout.flush()
os._exit(0)  # as torch_cudnn.py: no interpreter finalisation (torch's race at exit)
