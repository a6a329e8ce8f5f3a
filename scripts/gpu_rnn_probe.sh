#!/usr/bin/env bash
# On a real GPU with a CUDA PyTorch (python3): what NVIDIA's cuDNN answers for recurrent
# networks (scripts/cudnn_rnn_probe.py), real torch's LSTM step (tests/python/torch_rnn.py
# lstm), the CTC loss's workspace (scripts/cudnn_ctc_probe.py), cuFFT's and cuSOLVER's
# workspaces and plan and handle memory (scripts/cufft_cusolver_probe.py), and which cuDNN
# libraries a ResNet and an LSTM step load (LD_DEBUG=files). The fake
# cuDNN's RNN sizes are compared with the first two (README, "Fake GPU").
# usage: scripts/gpu_rnn_probe.sh OUTDIR
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:?usage: $0 OUTDIR}"
mkdir -p "$out"
python="${PYTHON:-python3}"
nvidia-smi -L >"$out/gpu.txt" 2>&1
"$python" scripts/cudnn_rnn_probe.py >"$out/probe.jsonl" 2>"$out/probe.err"
"$python" -W ignore tests/python/torch_rnn.py lstm >"$out/lstm.json" 2>"$out/lstm.err"
"$python" scripts/cudnn_ctc_probe.py >"$out/ctc.jsonl" 2>"$out/ctc.err"
"$python" scripts/cufft_cusolver_probe.py >"$out/fft_solver.jsonl" 2>"$out/fft_solver.err"
for mode in resnet; do
    LD_DEBUG=files LD_DEBUG_OUTPUT="$out/ld-$mode" "$python" -W ignore tests/python/torch_cudnn.py \
        "$mode" >"$out/$mode.json" 2>"$out/$mode.err"
done
LD_DEBUG=files LD_DEBUG_OUTPUT="$out/ld-lstm" "$python" -W ignore tests/python/torch_rnn.py lstm \
    >/dev/null 2>&1
# Which cuDNN files were loaded, and by whom (the ld.so debug logs are large: only these lines).
grep -h "file=.*libcudnn" "$out"/ld-* | sed 's/^ *[0-9]*: *//' | sort | uniq -c >"$out/cudnn-files.txt"
rm -f "$out"/ld-*
