#!/usr/bin/env python3
"""The test suite under every CPU kernel level this machine has (issue 23), forced one at a time with
SEXTANT_CPU_ISA: each given test executable passes under each level, and `sextant generate` gives
the same greedy ids on every level for the bundled model in Q8_0 (integer kernels: bit-exact) and
the same memorised text in F16 and F32 (float kernels: equal within rounding, which leaves the
memorised text alone, but not a continuation the model never learnt: on avx512-bf16 and amx F16
weights meet activations rounded to BF16, kernel_table.h; cpu_isa_parity checks the numbers). A level the machine lacks must be refused with
a message, never run.

  isa_levels_test.py SEXTANT MODELS_DIR TEST_EXE [TEST_EXE ...]
"""
import json
import os
import subprocess
import sys

LEVELS = ["amx", "avx512-bf16", "avx512-vnni", "avx512", "avx-vnni", "avx2", "baseline"]


def generate(sextant, model, level, ids, prompt="The"):
    env = dict(os.environ, SEXTANT_CPU_ISA=level)
    args = [sextant, "generate", "--model", model, "-n", "48", "--ignore-eos", "-t", "2", prompt]
    r = subprocess.run(args + (["--ids"] if ids else []), env=env, capture_output=True, text=True, timeout=300)
    return r


def main():
    sextant, models, tests = sys.argv[1], sys.argv[2], sys.argv[3:]
    q8 = os.path.join(models, "memorise-q8_0.gguf")
    memorised = json.load(open(os.path.join(models, "reference.json")))["prompt_text"]
    failures, used = [], []
    reference = {}
    for level in LEVELS:
        probe = generate(sextant, q8, level, True)
        if probe.returncode != 0:
            if "lacks what the" in probe.stderr or "not a kernel level" in probe.stderr:
                print(f"{level}: not on this machine or build ({probe.stderr.strip().splitlines()[-1]})")
                continue
            failures.append(f"{level}: sextant generate failed: {probe.stderr[-500:]}")
            continue
        used.append(level)
        outputs = {"q8_0 ids": probe.stdout}
        for fmt in ("f16", "f32"):
            r = generate(sextant, os.path.join(models, f"memorise-{fmt}.gguf"), level, False, memorised)
            if r.returncode != 0:
                failures.append(f"{level}: generate {fmt} failed: {r.stderr[-500:]}")
            outputs[f"{fmt} text"] = r.stdout
        for key, value in outputs.items():
            if not value.strip():
                failures.append(f"{level}: {key}: no output")
            reference.setdefault(key, (level, value))
            if value != reference[key][1]:
                failures.append(f"{level}: {key} differs from {reference[key][0]}'s:\n  {value[:200]!r}\n  "
                                f"{reference[key][1][:200]!r}")
        for exe in tests:
            env = dict(os.environ, SEXTANT_CPU_ISA=level)
            r = subprocess.run([exe], env=env, capture_output=True, text=True, timeout=900)
            status = "passed" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
            print(f"{level}: {os.path.basename(exe)} {status}")
            if r.returncode != 0:
                failures.append(f"{level}: {exe}:\n{r.stdout[-3000:]}{r.stderr[-1000:]}")
    # Nothing can be skipped silently: the machine may lack levels, never baseline and the build's best.
    if "baseline" not in used:
        failures.append("baseline level did not run")
    # A level that does not exist is refused by name.
    bad = generate(sextant, q8, "sse9", True)
    if bad.returncode == 0 or "SEXTANT_CPU_ISA=sse9" not in bad.stderr:
        failures.append(f"SEXTANT_CPU_ISA=sse9 was not refused: rc {bad.returncode}, {bad.stderr[-300:]!r}")
    print(f"levels run: {', '.join(used)}")
    for f in failures:
        print("FAIL " + f)
    sys.exit(1 if failures else 0)


main()
