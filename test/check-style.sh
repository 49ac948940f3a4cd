#!/usr/bin/env bash
# House rules that a compiler does not check, run by `make test`:
# every C++ file matches .clang-format, and every file of common/ includes
# cpp_only.hpp (which fails the build when a PostgreSQL header came first).
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
mapfile -t sources < <(git ls-files -co --exclude-standard -- '*.cpp' '*.hpp' '*.h')
# Pinned to one version: another formats some constructs differently.
# test/install-deps.sh installs it on Debian 12, where the style is checked.
format=clang-format-14
command -v $format >/dev/null || { echo "$format is not installed (test/install-deps.sh on Debian 12)"; exit 1; }
$format --dry-run -Werror "${sources[@]}" || status=1
for f in common/*.cpp common/*.hpp; do
  [ "$f" = common/cpp_only.hpp ] && continue
  grep -q '^#include "cpp_only.hpp"' "$f" || { echo "$f: does not include cpp_only.hpp"; status=1; }
done
[ $status -eq 0 ] && echo "style: ${#sources[@]} C++ files match .clang-format; common/ is pure C++"
exit $status
