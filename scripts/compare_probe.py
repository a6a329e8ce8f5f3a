"""Compares two outputs of the same library probe line by line: a real GPU's (REAL) against the
fakes' (FAKE), both from scripts/cudnn_rnn_probe.py, cudnn_ctc_probe.py or
cufft_cusolver_probe.py (one JSON object per line; the last names the card and is skipped).
Lines are matched by their identifying keys (a network's name; a CTC shape; a transform, or a
solver routine with its type and order); every other value is compared. Prints one line per
differing value (REAL's, FAKE's, the fake's difference in percent) and a summary: how many
values are equal, of how many (versions not compared), and the largest relative differences.

usage: python3 scripts/compare_probe.py REAL.jsonl FAKE.jsonl
"""
import json
import sys

# The keys naming a line (not compared); the first present in a line set decides.
IDENTITY = ("name", "shape", "lib", "routine", "transform", "type", "data_type", "n", "m",
            "batch")
# What names the software, not an answer (the dropout line carries them).
VERSIONS = ("gpu", "cudnn", "torch", "cuda")


def key_of(line):
    return tuple((k, json.dumps(line[k])) for k in IDENTITY if k in line)


def load(path):
    lines = {}
    with open(path, encoding="utf-8") as f:
        for text in f:
            if not text.strip():
                continue
            line = json.loads(text)
            if line.get("name") == "card":
                continue
            lines[key_of(line)] = line
    return lines


def leaves(value, path=""):
    """(path, number or other scalar) for every scalar inside VALUE."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{path}.{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    real, fake = load(sys.argv[1]), load(sys.argv[2])
    equal = total = 0
    differences = []
    for key, line in real.items():
        name = " ".join(f"{k}={v}" for k, v in key)
        other = fake.get(key)
        if other is None:
            print(f"{name}: missing from the fakes' output")
            continue
        skip = IDENTITY + VERSIONS
        theirs = dict(leaves({k: v for k, v in other.items() if k not in skip}))
        for path, value in leaves({k: v for k, v in line.items() if k not in skip}):
            total += 1
            got = theirs.get(path)
            if got == value:
                equal += 1
                continue
            off = ""
            if isinstance(value, (int, float)) and isinstance(got, (int, float)) and value:
                percent = 100.0 * (got / value - 1.0)
                off = f" ({percent:+.1f}%)"
                differences.append((abs(percent), f"{name} {path}"))
            print(f"{name} {path}: real {value}, fake {got}{off}")
    print(f"equal: {equal} of {total} values")
    for percent, where in sorted(differences, reverse=True)[:5]:
        print(f"largest: {where} {percent:.1f}%")


if __name__ == "__main__":
    main()
