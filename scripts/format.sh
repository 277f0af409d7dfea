#!/usr/bin/env bash
# Applies .clang-format to lspawn's C++ sources, or (--check) says how far they are from it.
#   scripts/format.sh --check   # the files that differ and the lines that would change; exit 1 if any
#   scripts/format.sh           # rewrites them in place (one commit of its own: git blame skips it
#                               # with --ignore-rev)
# The sources: every tracked *.cpp, *.hpp, *.h outside python/ (the Python shims follow torch's
# headers' layout) and third-party copies. Needs clang-format (Debian: clang-format-14).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v clang-format >/dev/null || { echo "format.sh: clang-format is not installed (apt-get install clang-format)" >&2; exit 2; }
mode=apply
case ${1:-} in
  --check) mode=check ;;
  "") ;;
  *) echo "format.sh: unknown argument '$1' (expected --check or nothing)" >&2; exit 2 ;;
esac
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' | grep -v '^python/')
if [[ $mode == apply ]]; then
  clang-format -i --style=file "${files[@]}"
  echo "format.sh: ${#files[@]} files formatted"
  exit 0
fi
differ=0 lines=0
for f in "${files[@]}"; do
  n=$(clang-format --style=file "$f" | diff "$f" - | grep -c '^>' || true)
  if ((n > 0)); then
    differ=$((differ + 1)) lines=$((lines + n))
    echo "$f: $n lines"
  fi
done
echo "format.sh: $differ of ${#files[@]} files differ from .clang-format ($lines lines would change)"
((differ == 0))
