#!/usr/bin/env python3
"""The portable build's binaries start on any x86-64 machine (issue 23): outside the CPU kernel units,
compiled once per ISA level into sx::cpu::isa_<level> (backends/cpu/kernels/kernel_table.h), no
function holds an AVX, AVX2, FMA, F16C or AVX-512 instruction (every VEX/EVEX mnemonic starts with
'v', the AVX-512 mask ones with 'k'), since nothing checks the CPU before such code runs; and no
function outside sx::cpu::isa_amx holds an AMX instruction (tile*, tdp*, ldtilecfg, sttilecfg).

  isa_code_test.py BINARY [BINARY ...]

Fails naming each function at fault and its first such instruction; also fails when the kernels of
the AVX2 and AVX-512 levels hold none (the disassembly was not read as it should have been).
"""
import re
import subprocess
import sys

# Functions outside the kernel namespaces that may hold AVX code because they check the CPU first.
ALLOWED = [
    re.compile(r"read_slice_avx2"),  # runtime/base/membw.cpp: __attribute__((target("avx2"))), __builtin_cpu_supports
]
KERNEL = re.compile(r"\bsx::cpu::isa_(\w+)::")
FUNC = re.compile(r"^[0-9a-f]+ <(.*)>:$")
INSN = re.compile(r"^\s+[0-9a-f]+:\s+(\S+)\s*(.*)$")


def check(binary):
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", binary], check=True, capture_output=True,
                         text=True).stdout
    bad, kernel_vector = {}, {}
    func = ""
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            func = m.group(1)
            continue
        m = INSN.match(line)
        if not m:
            continue
        mnem = m.group(1)
        if re.match(r"(tile|tdp|ldtilecfg|sttilecfg)", mnem):
            k = KERNEL.search(func)
            if (not k or k.group(1) != "amx") and func not in bad:
                bad[func] = f"{mnem} {m.group(2)}".strip()
            continue
        vector = (mnem.startswith("v") and mnem not in ("verr", "verw")) or re.match(r"k(mov|and|or|xor|not|test|shift|add|unpck)", mnem)
        vector = vector or "%ymm" in m.group(2) or "%zmm" in m.group(2)
        if not vector:
            continue
        k = KERNEL.search(func)
        if k:
            kernel_vector[k.group(1)] = kernel_vector.get(k.group(1), 0) + 1
        elif not any(a.search(func) for a in ALLOWED) and func not in bad:
            bad[func] = f"{mnem} {m.group(2)}".strip()
    errors = [f"{binary}: {f}: {i}" for f, i in sorted(bad.items())]
    for level in ("avx2", "avx512"):
        if kernel_vector.get(level, 0) == 0:
            errors.append(f"{binary}: no vector instruction in sx::cpu::isa_{level}:: (kernels not linked, or the "
                          "disassembly was misread)")
    if kernel_vector.get("baseline", 0):
        errors.append(f"{binary}: {kernel_vector['baseline']} vector instructions in sx::cpu::isa_baseline::")
    return errors, kernel_vector


def main():
    failed = False
    for binary in sys.argv[1:]:
        errors, counts = check(binary)
        print(f"{binary}: vector instructions per kernel level: " +
              ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        for e in errors[:50]:
            print("FAIL " + e)
        if len(errors) > 50:
            print(f"... and {len(errors) - 50} more")
        failed = failed or bool(errors)
    if failed:
        sys.exit(1)
    print("ok: no AVX instruction outside the kernel units")


main()
