#!/usr/bin/env bash
# chroot.sh never leaves a mount behind: not when the command succeeds or
# fails, not on SIGTERM or SIGINT, not when a mount fails half-way, not when
# the command leaves a process running; and in its private namespace not
# even on SIGKILL. Runs against the cached chroot of a major:
#   prove test/majors/mounts.t :: 17
# It also checks what the chroot shares with the host: its postgres user.
set -uo pipefail
cd "$(dirname "$0")/../.."
major=${1:-17}
chroot_sh=test/majors/chroot.sh
root=$($chroot_sh path "$major")
n=0 failed=0
ok() { n=$((n + 1)); if [ "$1" = 0 ]; then echo "ok $n - $2"; else echo "not ok $n - $2"; failed=1; fi; }
is() { [ "$1" = "$2" ]; local r=$?; ok $r "$3"; [ $r = 0 ] || echo "#   got '$1', expected '$2'"; }
if [ ! -f "$root/.billguard-stamp" ]; then echo "1..0 # SKIP no chroot for $major ($chroot_sh ensure $major)"; exit 0; fi

# Mounts at or below the chroot, as this (the host's) namespace sees them.
host_mounts() { awk -v d="$root" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort; }
# Processes whose root is the chroot.
inside() { for p in /proc/[0-9]*; do [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && echo "${p#/proc/}"; done; }
# Waits until a process runs in the chroot, at most 30 s.
until_inside() { for _ in $(seq 150); do [ -n "$(inside)" ] && return 0; sleep 0.2; done; return 1; }
# Waits for a background run to end, at most 30 s; sets $status to its exit
# status, or "running".
ended() {
  status=running
  for _ in $(seq 150); do
    kill -0 "$1" 2>/dev/null || { wait "$1"; status=$?; return; }
    sleep 0.2
  done
}
# Background runs keep the default SIGINT (a script's background jobs
# ignore it otherwise), as a run in a terminal has.
set -m

is "$(host_mounts)" "" "before: nothing is mounted in the chroot"

# ---- the private namespace (the default) -----------------------------------------------
inner=$($chroot_sh run "$major" sh -c 'awk "{print \$5}" /proc/self/mountinfo | grep -E "^/(proc|sys|dev/pts|dev/shm|src|tmp/billguard-ports)$" | sort | tr "\n" " "; touch /src/.probe 2>/dev/null && echo writable || echo read-only')
is "$inner" "/dev/pts /dev/shm /proc /src /sys /tmp/billguard-ports read-only" "inside: proc, sysfs, devpts, /dev/shm, the clone (read-only), the port reservations"
is "$(host_mounts)" "" "the host never sees them"
# They share /tmp/billguard-ports, where a reservation of another uid
# cannot be opened.
if id -u postgres >/dev/null 2>&1; then
  is "$($chroot_sh run "$major" sh -c 'echo $(id -u postgres):$(id -g postgres)')" "$(id -u postgres):$(id -g postgres)" \
    "inside, postgres has the host's uid and gid"
fi

$chroot_sh run "$major" sh -c 'exit 7'
is "$?" 7 "a failing command's exit status is the run's"
is "$(host_mounts)" "" "after a failing command: nothing mounted"

for sig in TERM INT; do
  $chroot_sh run "$major" sleep 300 &
  pid=$!
  until_inside
  ok $? "SIG$sig: the command runs in the chroot"
  kill -$sig $pid
  ended $pid
  [ $sig = TERM ] && want=143 || want=130
  is "$status" "$want" "SIG$sig: the run ends at once, with status $want"
  is "$(inside)" "" "SIG$sig: nothing runs in the chroot any more"
  is "$(host_mounts)" "" "SIG$sig: nothing mounted"
done

$chroot_sh run "$major" sleep 300 &
pid=$!
until_inside
# (bash's notice of the killed job goes to its own stderr)
exec 3>&2 2>/dev/null
kill -KILL $pid
wait $pid
exec 2>&3 3>&-
is "$(host_mounts)" "" "SIGKILL: the mounts were never the host's, so none is left on it"
left=$(inside)
[ -n "$left" ] && kill -KILL $left

# ---- the host's namespace: only the trap unmounts ----------------------------------------
export BILLGUARD_CHROOT_NAMESPACE=host
$chroot_sh run "$major" sleep 300 &
pid=$!
until_inside
is "$(host_mounts | wc -l | tr -d ' ')" 6 "host namespace: the six mounts are the host's while it runs"
kill -TERM $pid
ended $pid
is "$status" 143 "host namespace, SIGTERM: the run ends at once"
is "$(host_mounts)" "" "host namespace, SIGTERM: the trap unmounted everything"

BILLGUARD_CHROOT_SRC=/nonexistent/clone $chroot_sh run "$major" true 2>/dev/null
ok $([ $? -ne 0 ]; echo $?) "host namespace: a mount that fails half-way fails the run"
is "$(host_mounts)" "" "host namespace: the mounts made before it are gone"

$chroot_sh run "$major" sh -c 'sleep 300 & exit 0' 2>/dev/null
is "$?" 0 "host namespace: a command that leaves a process running succeeds"
is "$(inside)" "" "host namespace: the process it left was ended"
is "$(host_mounts)" "" "host namespace: nothing mounted"

# Never leave one behind, even if this test failed.
for m in $(host_mounts | sort -r); do umount -l "$m"; done
echo "1..$n"
exit $failed
