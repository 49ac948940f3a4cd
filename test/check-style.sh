#!/usr/bin/env bash
# House rules that a compiler does not check, run by `make test`:
# every C++ file matches .clang-format, every file of common/ includes
# cpp_only.hpp (which fails the build when a PostgreSQL header came first),
# no two source files of the product share a name, and every SQL-callable
# function is declared through BILLGUARD_SQL_FUNCTION.
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
# A name says what one file is: a header and its .cpp share it, two folders
# never do (a bare include, a stack trace or a search would find either).
# A program's entry point, main.cpp, is named by its folder.
duplicates=$(git ls-files -co --exclude-standard -- extension common worker tools |
  grep -E '\.(cpp|hpp|h|c)$' | grep -v '/main\.cpp$' |
  awk '{ name = $0; sub(/.*\//, "", name); sub(/\.[^.]*$/, "", name); dir = $0; sub(/\/[^\/]*$/, "", dir)
         if (!((name, dir) in seen)) { seen[name, dir] = 1; dirs[name] = dirs[name] " " dir "/"; count[name]++ } }
       END { for (name in count) if (count[name] > 1) print name ":" dirs[name] }' | sort)
if [ -n "$duplicates" ]; then
  echo "source files that share a name (rename one to say what it is):"
  echo "$duplicates"
  status=1
fi
# The extension names common/'s headers "common/<name>.hpp", as PostgreSQL
# names its own "common/<name>.h" (common/jsonapi.h): a .h file in common/
# would take the place of PostgreSQL's header of that name.
if git ls-files -co --exclude-standard -- 'common/*.h' | grep -q .; then
  echo "common/ holds a .h file, which would shadow PostgreSQL's common/ header of that name:"
  git ls-files -co --exclude-standard -- 'common/*.h'
  status=1
fi
# A SQL-callable function is declared by BILLGUARD_SQL_FUNCTION alone, so
# that its body always runs inside GuardedCall.
if git grep -n 'PG_FUNCTION_INFO_V1' -- extension ':!extension/postgres/sql_function.hpp'; then
  echo "declare SQL-callable functions with BILLGUARD_SQL_FUNCTION (extension/postgres/sql_function.hpp)"
  status=1
fi
[ $status -eq 0 ] && echo "style: ${#sources[@]} C++ files match .clang-format; common/ is pure C++; no two source files share a name"
exit $status
