#!/usr/bin/env bash
# `make test`: the whole suite on every supported PostgreSQL major, one
# after the other (they share the machine's cores): 15 on this machine
# (Debian bookworm), 17 and 18 in the Debian chroots of chroot.sh.
# `make test PG=17` (or PG="15 18") runs those only.
#   test/majors/test.sh [MAJOR...]
# TAP_TESTS and the other settings of test/run-all.sh pass through.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=test/majors
host_major=15
[ $# -gt 0 ] || set -- 15 17 18

results=()
failed=0

# Runs a major's suite with the time since its start before each "== "
# heading, so the log tells what each part took; a suite run-all.sh skipped
# is kept in $skip_note for the summary.
skip_note=$(mktemp)
timed() {
  local t0=$SECONDS line
  : >"$skip_note"
  "$@" 2>&1 | while IFS= read -r line; do
    case $line in
      "== "*) printf '[%4d s] %s\n' $((SECONDS - t0)) "$line" ;;
      "all suites passed, but one was skipped: "*) printf '%s\n' "$line"; echo "${line#*skipped: }" >"$skip_note" ;;
      *) printf '%s\n' "$line" ;;
    esac
  done
  return "${PIPESTATUS[0]}"
}
summary() {
  rm -f "$skip_note"
  echo
  echo "== per major"
  printf '%s\n' "${results[@]}"
}
trap summary EXIT

chroot_checked=0
for major in "$@"; do
  t0=$SECONDS
  status=passed
  if [ "$major" = "$host_major" ]; then
    echo "===== PostgreSQL $major (this machine)"
    timed test/run-all.sh || status=FAILED
  else
    echo "===== PostgreSQL $major (chroot)"
    if [ $chroot_checked = 0 ]; then
      # The house rules are checked once, on the host's pinned clang-format.
      case " $* " in
        *" $host_major "*) ;;
        *) test/check-style.sh || { failed=1; results+=("house rules: FAILED"); } ;;
      esac
      chroot_checked=1
    fi
    c0=$SECONDS
    if $here/chroot.sh ensure "$major"; then
      ready=$((SECONDS - c0))
      # Its mounts never outlive a run, however the run ends.
      prove $here/mounts.t :: "$major" || status=FAILED
      mkdir -p .build && git ls-files -co --exclude-standard -z >.build/sources.list
      timed $here/chroot.sh run "$major" /src/$here/inside.sh || status=FAILED
    else
      ready=$((SECONDS - c0))
      status="FAILED (no chroot)"
    fi
  fi
  [ "$status" = passed ] || failed=1
  [ "$status" = passed ] && [ -s "$skip_note" ] && status="passed, but skipped $(cat "$skip_note")"
  line="PostgreSQL $major: $status in $((SECONDS - t0)) s"
  [ "$major" != "$host_major" ] && line+=" (chroot ready in $ready s)"
  results+=("$line")
done
[ $failed -eq 0 ]
