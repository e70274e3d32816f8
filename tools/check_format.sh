#!/usr/bin/env bash
# tools/check_format.sh [--fix] — checks that every tracked C++ and CUDA file is formatted as
# .clang-format says (Google style, 100 columns), with clang-format 14 (Debian 12's; other
# versions format some constructs differently). Generated files are skipped. CI runs it
# (.ci/run); --fix rewrites the files.
set -euo pipefail
cd "$(dirname "$0")/.."
fmt=$(command -v clang-format-14 || command -v clang-format || true)
if [ -z "$fmt" ]; then
  echo "check_format: clang-format not found (tools/install_deps.sh installs it)" >&2
  exit 1
fi
# Generated files (their first line says GENERATED) stay as their generator writes them.
files=()
while IFS= read -r f; do
  head -n 1 "$f" | grep -q GENERATED || files+=("$f")
done < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = --fix ]; then
  "$fmt" -i "${files[@]}"
  echo "check_format: formatted ${#files[@]} files with $("$fmt" --version)"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$fmt" --dry-run --Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not formatted ($("$fmt" --version)):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  echo "check_format: tools/check_format.sh --fix formats them" >&2
  exit 1
fi
echo "check_format: all ${#files[@]} C++/CUDA files formatted as .clang-format says"
