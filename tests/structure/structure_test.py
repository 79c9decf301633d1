#!/usr/bin/env python3
"""Issue 54 item 4: the layering of DESIGN.md §2, checked on every #include of runtime/, daemon/,
backends/ and kernels/ (tests excluded).

    base <- hal <- {model, tokenizer, parallel, kv, sched} <- engine <- daemon
    backends/* see only base and hal; kernels/ sees only CUDA; kv/ and sched/ never include hal/;
    hub/ sees only base; model/ reads formats, never device limits; daemon/ never names a backend.

Each source folder has the list of folders (or single headers) it may include; anything else fails,
naming the file, the line and the include. Also: no `..` in an include (it would walk around the
rules), and no GPU SDK header (<cuda_runtime.h>, <vulkan/...>, <nccl.h>, ...) outside backends/ and
kernels/ (the runtime links no GPU SDK; the daemon starts where they are absent).

A short list of known leaks (KNOWN_LEAKS) is tolerated until fixed; it may only shrink.

Usage: structure_test.py SOURCE_ROOT. Exit 0 when every include is allowed, 1 otherwise.
"""
import os
import re
import sys

SOURCE_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".inc")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')

# Where a file lives -> what it may include (a prefix ending in "/" is a folder, else one header).
# The first matching key (longest first) applies. A folder may always include itself.
RUNTIME_PEERS_BASE = ["runtime/base/"]
# model/ reads formats: the HAL's format headers (dtypes, quant blocks), never its ops, devices,
# limits or registry.
HAL_FORMATS = ["runtime/hal/dtype.h", "runtime/hal/quant.h"]
ALLOWED = {
    "runtime/base/": [],
    "runtime/hal/": RUNTIME_PEERS_BASE,
    "runtime/model/": RUNTIME_PEERS_BASE + HAL_FORMATS,
    "runtime/tokenizer/": RUNTIME_PEERS_BASE,
    "runtime/parallel/": RUNTIME_PEERS_BASE + ["runtime/hal/", "runtime/model/"],
    "runtime/kv/": RUNTIME_PEERS_BASE,
    "runtime/sched/": RUNTIME_PEERS_BASE + ["runtime/kv/"],
    "runtime/hub/": RUNTIME_PEERS_BASE,
    "runtime/engine/": ["runtime/base/", "runtime/hal/", "runtime/model/", "runtime/tokenizer/", "runtime/parallel/",
                        "runtime/kv/", "runtime/sched/", "runtime/hub/"],
    # The registry is the one place that knows which backends were compiled in (and the CUDA
    # module's loader, which opens backends/cuda as a loadable module).
    "backends/registry.": ["runtime/base/", "runtime/hal/", "backends/"],
    "backends/cuda_loader.": ["runtime/base/", "runtime/hal/", "backends/cuda_loader.h", "backends/cuda/module_abi.h"],
    "backends/common/": ["runtime/base/", "runtime/hal/"],
    "backends/cpu/": ["runtime/base/", "runtime/hal/", "backends/common/"],
    "backends/vulkan/": ["runtime/base/", "runtime/hal/", "backends/common/"],
    "backends/cuda/": ["runtime/base/", "runtime/hal/", "backends/common/", "kernels/"],
    # nvcc compiles these: the op arguments and the host half conversions, nothing with fmt.
    "kernels/": ["runtime/base/half.h", "runtime/base/op_limits.h", "runtime/hal/ops.h"],
    # The daemon reaches backends only through the registry (hal::Backend), never by name.
    "daemon/": ["runtime/", "backends/registry.h"],
}
# Known leaks still to move behind the registry, each (file, include): allowed while they last, and
# the test fails once one is gone so that the list only shrinks. Never add to it.
KNOWN_LEAKS = {
    # doctor's NCCL check (library, version, NCCL_* variables) reads the CUDA backend's host code;
    # it belongs behind hal::Backend like the kernel report (issue 54 item 4).
    ("daemon/commands/cmd_doctor.cpp", "backends/cuda/nccl_api.h"),
}
# Headers of a GPU SDK: only backends/ and kernels/ include them.
GPU_SDK = re.compile(r"^(cuda[^/]*\.h|cuda/|cublas|cufft|curand|nccl\.h|nvml\.h|vulkan/|vk_mem_alloc\.h|hip/|rocm)")
SCANNED = ("runtime", "daemon", "backends", "kernels")


def rule_for(rel):
    for key in sorted(ALLOWED, key=len, reverse=True):
        if rel.startswith(key):
            return key
    return None


def allowed(rel, key, inc):
    if inc.startswith(key) and key.endswith("/"):
        return True  # the folder itself
    for a in ALLOWED[key]:
        if (a.endswith("/") and inc.startswith(a)) or inc == a:
            return True
    return False


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = sys.argv[1]
    errors, files, seen_leaks = [], 0, set()
    for top in SCANNED:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_SUFFIXES):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                key = rule_for(rel)
                if key is None:
                    errors.append(f"{rel}: no layering rule for this file (add its folder to tests/structure/"
                                  "structure_test.py's ALLOWED, following DESIGN.md §2)")
                    continue
                files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        quote, inc = m.group(1), m.group(2).strip()
                        where = f"{rel}:{lineno}: #include {quote}{inc}{'>' if quote == '<' else quote}"
                        if quote == "<":
                            if GPU_SDK.match(inc) and not rel.startswith(("backends/", "kernels/")):
                                errors.append(f"{where}: a GPU SDK header outside backends/ and kernels/")
                            continue
                        if ".." in inc.split("/"):
                            errors.append(f"{where}: a relative path out of the folder (name it from the root)")
                            continue
                        if "/" not in inc:
                            continue  # beside the file (generated SPIR-V, ...)
                        if (rel, inc) in KNOWN_LEAKS:
                            seen_leaks.add((rel, inc))
                            continue
                        if not allowed(rel, key, inc):
                            errors.append(f"{where}: {key.rstrip('/.')} may include only itself"
                                          f"{', ' if ALLOWED[key] else ''}{', '.join(ALLOWED[key])} (DESIGN.md §2)")
    for rel, inc in sorted(KNOWN_LEAKS - seen_leaks):
        errors.append(f"{rel}: no longer includes {inc}: remove it from KNOWN_LEAKS in tests/structure/structure_test.py")
    for e in errors:
        print(e)
    print(f"structure: {files} files checked, {len(errors)} include(s) against the layering")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
