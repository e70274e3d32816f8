#!/usr/bin/env bash
# tools/cuda_resources.sh — the launch resources of every CUDA kernel in a build, as a compact
# Markdown table: per kernel (all template instances of one kernel in one source file together,
# worst case shown), its launch bound (__launch_bounds__ max threads), registers per thread,
# static shared memory and stack frame per thread (register spills and local arrays live there;
# "+N": N more bytes of other local memory) for each architecture in the binary; `nvcc -Xptxas=-v`
# tells spills apart. For checking without a GPU that no kernel can fail at launch with "too many
# resources requested" (registers × threads over the register file) and for the table in
# docs/cuda.md ("Launch resources"). Dynamic shared memory is a launch argument, not in the
# binary: that column of the docs table comes from the launchers.
#
# Usage: tools/cuda_resources.sh [FILE...]   FILE: libloom.so or .cu.o objects
#        (default build/lib/libloom.so). Needs cuobjdump (CUOBJDUMP=path, PATH or
#        /usr/local/cuda/bin; pip's nvidia-cuda-cuobjdump has one), c++filt and python3.
# Exit status 1 when a Loom kernel has no launch bound, when registers × bound exceed the 64K
# registers of a block, or static shared memory exceeds 48 KiB.
set -euo pipefail

files=("$@")
[[ ${#files[@]} -gt 0 ]] || files=(build/lib/libloom.so)
cuobjdump=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
[[ -x $cuobjdump ]] || { echo "cuda_resources: no cuobjdump (set CUOBJDUMP)" >&2; exit 2; }
command -v c++filt >/dev/null || { echo "cuda_resources: no c++filt" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for f in "${files[@]}"; do
  # (cuobjdump's own notes, such as "Skipping .debug_frame section", go to $tmp/err.)
  "$cuobjdump" -res-usage "$f" >>"$tmp/res" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 2; }
  "$cuobjdump" -elf "$f" 2>"$tmp/err" >"$tmp/elf_full" || { cat "$tmp/err" >&2; exit 2; }
  grep -E '^arch = |^\.nv\.info\._Z|EIATTR_MAX_THREADS|^[[:space:]]*Value:' "$tmp/elf_full" \
    >>"$tmp/elf"
done

python3 - "$tmp" <<'PY'
import collections, re, subprocess, sys

tmp = sys.argv[1]
res = {}          # (arch, mangled) -> dict(REG, SHARED, LOCAL, STACK)
arch, fn = None, None
for line in open(f"{tmp}/res"):
    m = re.match(r"arch = (sm_\d+)", line)
    if m: arch = m.group(1); continue
    m = re.match(r"\s*Function (\S+):", line)
    if m: fn = m.group(1); continue
    if fn and "REG:" in line:
        res[(arch, fn)] = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", line)}
        fn = None

bound = {}        # (arch, mangled) -> max threads (x·y·z)
arch, fn, want = None, None, False
for line in open(f"{tmp}/elf"):
    m = re.match(r"arch = (sm_\d+)", line)
    if m: arch = m.group(1); continue
    if line.startswith(".nv.info._Z"): fn = line.strip()[len(".nv.info."):]; continue
    if "EIATTR_MAX_THREADS" in line: want = True; continue
    if want and "Value:" in line:
        x, y, z = (int(v, 16) for v in line.split()[1:4])
        bound[(arch, fn)] = x * y * z
        want = False

names = sorted({fn for _, fn in res})
demangled = dict(zip(names, subprocess.run(["c++filt"], input="\n".join(names), text=True,
                                           capture_output=True, check=True).stdout.split("\n")))

def kernel_key(mangled):
    d = demangled.get(mangled, mangled).replace("(anonymous namespace)", "anon")
    d = re.sub(r"^void ", "", d)
    depth, cut = 0, len(d)
    for i, c in enumerate(d):
        if c in "<(" and depth == 0: cut = i; break
    qual = d[:cut]
    name = qual.split("::")[-1]
    m = re.search(r"_GLOBAL__N__[0-9a-f]+_\d+_(\w+?)_cu_", mangled)
    src = m.group(1) + ".cu" if m else ("cub" if qual.startswith(("cub::", "CUB_")) or "cub" in qual.split("::")[0] else "")
    return name, src

archs = sorted({a for a, _ in res})
groups = collections.defaultdict(lambda: collections.defaultdict(list))
for (a, fn), r in res.items():
    groups[kernel_key(fn)][a].append((fn, r))

bad = []
rows = []
for (name, src), per_arch in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    inst = max(len(v) for v in per_arch.values())
    bounds = {bound.get((a, fn)) for a, v in per_arch.items() for fn, _ in v}
    threads = "/".join(str(b) if b else "none" for b in sorted(bounds, key=lambda b: b or 0))
    regs, smem, local = [], [], []
    for a in archs:
        v = per_arch.get(a, [])
        regs.append(str(max((r["REG"] for _, r in v), default=0)) if v else "-")
        st, lo = max(r["STACK"] for _, r in v) if v else 0, max(r["LOCAL"] for _, r in v) if v else 0
        local.append("-" if not v else (f"{st}+{lo}" if lo else str(st)))
        smem.append(str(max(r["SHARED"] for _, r in v)) if v else "-")
        for fn, r in v:
            b = bound.get((a, fn))
            if src != "cub" and not b:
                bad.append(f"{name} ({src}, {a}): no __launch_bounds__")
            elif b and r["REG"] * b > 65536:
                bad.append(f"{name} ({src}, {a}): {r['REG']} registers × {b} threads > 65536")
            if r["SHARED"] > 48 * 1024:
                bad.append(f"{name} ({src}, {a}): static shared memory {r['SHARED']} B > 48 KiB")
    rows.append((name, src, inst, threads, regs, smem, local))

arch_cols = " / ".join(archs)
print(f"| kernel | file | instances | threads (bound) | registers {arch_cols} "
      f"| static smem B {arch_cols} | stack B/thread {arch_cols} |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for name, src, inst, threads, regs, smem, local in rows:
    print(f"| {name} | {src} | {inst} | {threads} | {' / '.join(regs)} | {' / '.join(smem)} | "
          f"{' / '.join(local)} |")
total = sum(len(v) for p in groups.values() for v in p.values())
print(f"\n{len(rows)} kernels, {total} compiled functions ({', '.join(archs)}); "
      f"{len(set(bad))} problems")
for b in sorted(set(bad)):
    print("PROBLEM:", b)
sys.exit(1 if bad else 0)
PY
