#!/usr/bin/env python3
"""HAL (de)quantisers against gguf-py, ggml's own independent numpy implementation.

usage: dequant_reference_test.py <dequant_tool>

Dequantisation: for every GGML block format, random blocks (random bytes, with every fp16 scale
field replaced by a finite value, edge values included: +-0, the smallest subnormal, the largest
subnormal, the smallest normal, 1, +-65504) are dequantised by both; the floats must be
bit-identical (compared as uint32).
Quantisation: for the formats whose Sextant quantiser is ggml's reference one (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0), random rows must give identical bytes.
Exits 77 (meson: skipped) when the venv lacks the `gguf` package (scripts/setup installs it).
"""
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
    from gguf import GGMLQuantizationType as Q
    from gguf import quants
except ImportError as e:  # pragma: no cover - depends on the environment
    print(f"SKIP: {e} (run scripts/setup to create .venv-test with gguf)")
    sys.exit(77)

# name -> (gguf type, block bytes, byte offsets of fp16 fields)
FORMATS = {
    "q4_0": (Q.Q4_0, 18, [0]),
    "q4_1": (Q.Q4_1, 20, [0, 2]),
    "q5_0": (Q.Q5_0, 22, [0]),
    "q5_1": (Q.Q5_1, 24, [0, 2]),
    "q8_0": (Q.Q8_0, 34, [0]),
    "q2_k": (Q.Q2_K, 84, [80, 82]),
    "q3_k": (Q.Q3_K, 110, [108]),
    "q4_k": (Q.Q4_K, 144, [0, 2]),
    "q5_k": (Q.Q5_K, 176, [0, 2]),
    "q6_k": (Q.Q6_K, 210, [208]),
}
QUANTIZE_SAME_AS_GGML = ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0"]
EDGE_F16 = [0x0000, 0x8000, 0x0001, 0x8001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF]
N_BLOCKS = 4096


def run_tool(tool, mode, name, data, tmp):
    src, dst = os.path.join(tmp, "in.bin"), os.path.join(tmp, "out.bin")
    data.tofile(src)
    subprocess.run([tool, mode, name, src, dst], check=True)
    return np.fromfile(dst, dtype=np.uint8)


def random_blocks(rng, block_bytes, f16_offsets):
    blocks = rng.integers(0, 256, size=(N_BLOCKS, block_bytes), dtype=np.uint8)
    for off in f16_offsets:
        h = blocks[:, off:off + 2].copy().view(np.uint16).reshape(-1)
        # Finite: an all-ones exponent (inf / nan) loses its top exponent bit.
        inf_nan = (h & 0x7C00) == 0x7C00
        h[inf_nan] &= np.uint16(0xBFFF)
        # Edge values in a good share of the blocks.
        pick = rng.random(N_BLOCKS) < 0.3
        h[pick] = rng.choice(np.array(EDGE_F16, dtype=np.uint16), size=int(pick.sum()))
        blocks[:, off:off + 2] = h.view(np.uint8).reshape(N_BLOCKS, 2)
    # A few blocks of all-zero and all-0xFF quants (scale fields kept).
    for b in range(8):
        fill = 0 if b % 2 == 0 else 0xFF
        keep = {o: blocks[b, o:o + 2].copy() for o in f16_offsets}
        blocks[b, :] = fill
        for o, v in keep.items():
            blocks[b, o:o + 2] = v
    return blocks


def main():
    tool = sys.argv[1]
    rng = np.random.default_rng(20240606)
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, (qt, block_bytes, f16_offsets) in FORMATS.items():
            blocks = random_blocks(rng, block_bytes, f16_offsets)
            ref = quants.dequantize(blocks, qt).astype(np.float32).reshape(-1)
            got = run_tool(tool, "dequantize", name, blocks, tmp).view(np.float32)
            if got.shape != ref.shape:
                print(f"FAIL dequantize {name}: {got.size} floats, gguf-py {ref.size}")
                failures += 1
                continue
            rb, gb = ref.view(np.uint32), got.view(np.uint32)
            same = (rb == gb) | (np.isnan(ref) & np.isnan(got))
            bad = np.flatnonzero(~same)
            if bad.size:
                i = int(bad[0])
                print(f"FAIL dequantize {name}: {bad.size} of {ref.size} floats differ; first at element {i} "
                      f"(block {i // (ref.size // N_BLOCKS)}): sextant {got[i]!r} ({gb[i]:#010x}), "
                      f"gguf-py {ref[i]!r} ({rb[i]:#010x})")
                failures += 1
            else:
                print(f"ok   dequantize {name}: {ref.size} floats bit-identical")

        for name in QUANTIZE_SAME_AS_GGML:
            qt, block_bytes, _ = FORMATS[name]
            # Rows with a varied range per block, an all-zero block and exact ties.
            x = (rng.standard_normal((N_BLOCKS, 32)) * rng.uniform(1e-3, 10, (N_BLOCKS, 1))).astype(np.float32)
            x[0] = 0
            x[1] = np.arange(32, dtype=np.float32) - 16
            x = x.reshape(-1)
            ref = quants.quantize(x.reshape(1, -1), qt).reshape(-1)
            got = run_tool(tool, "quantize", name, x, tmp)
            if got.shape != ref.shape or not np.array_equal(got, ref):
                diff = np.flatnonzero(got != ref) if got.shape == ref.shape else []
                where = f"first differing byte {int(diff[0])} (block {int(diff[0]) // block_bytes})" if len(diff) else \
                    f"sizes {got.size} vs {ref.size}"
                print(f"FAIL quantize {name}: bytes differ from gguf-py; {where}")
                failures += 1
            else:
                print(f"ok   quantize {name}: {ref.size} bytes identical")
    if failures:
        print(f"{failures} check(s) failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
