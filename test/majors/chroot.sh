#!/usr/bin/env bash
# Debian chroots for the PostgreSQL majors that this machine's Debian
# (bookworm, PostgreSQL 15) does not carry: trixie for 17, forky for 18.
#
#   test/majors/chroot.sh ensure MAJOR       build the chroot, or reuse it when current
#   test/majors/chroot.sh run MAJOR CMD...   run CMD in it as root (the clone at /src, read-only)
#   test/majors/chroot.sh shell MAJOR        an interactive shell in it
#   test/majors/chroot.sh path MAJOR         print its directory
#   test/majors/chroot.sh stamp MAJOR        print the stamp a current chroot has
#   test/majors/chroot.sh remove MAJOR       delete it
#
# A chroot is cached outside the clone, in $BILLGUARD_CHROOT_CACHE
# (/var/cache/billguard/chroots/<suite>), and reused while its stamp (a hash
# of the functions here that build it, test/install-deps.sh, the suite and
# the mirror) matches;
# a missing or stale one is built anew beside it and swapped in only once
# complete. One older than BILLGUARD_CHROOT_MAX_AGE_DAYS (7) is upgraded in
# place, so point releases arrive.
#
# What runs inside sees proc, sysfs, its own devpts (newinstance), a tmpfs on
# /dev/shm, the clone at /src and the host's port reservations for
# PostgreSQL's test harness. These mounts live in a private mount namespace
# (unshare), so the host never sees them and the kernel drops them however the
# run ends, even on SIGKILL; a trap also unmounts them on every exit path, and
# first ends, by pid, the processes still running in that namespace (a server
# a failed test left behind). BILLGUARD_CHROOT_NAMESPACE=host mounts in the
# host's namespace instead, where only the trap unmounts (the test of the trap
# uses it, test/majors/mounts.t).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
clone=${BILLGUARD_CHROOT_SRC:-$(cd "$here/../.." && pwd)}
cache=$(realpath -m "${BILLGUARD_CHROOT_CACHE:-/var/cache/billguard/chroots}")
mirror=${BILLGUARD_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security_mirror=${BILLGUARD_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
max_age_days=${BILLGUARD_CHROOT_MAX_AGE_DAYS:-7}
namespace=${BILLGUARD_CHROOT_NAMESPACE:-private}
# PostgreSQL's TAP harness reserves ports with files in PG_TEST_PORT_DIR; the
# chroot shares it with the host, since they share one network.
port_dir=/tmp/billguard-ports

die() { echo "chroot.sh: $*" >&2; exit 2; }
log() { echo "chroot.sh: $*" >&2; }

suite_of() {
  case $1 in
    17) echo trixie ;;
    18) echo forky ;;
    *) die "PostgreSQL $1 has no chroot (17: trixie, 18: forky; 15 runs on the host)" ;;
  esac
}

# The suite that carries the major before a suite's, for pg_upgrade from it.
previous_suite() {
  case $1 in
    trixie) echo bookworm ;;
    forky) echo trixie ;;
  esac
}

# bookworm's debootstrap knows no forky: its sid script bootstraps any
# suite of the same layout.
debootstrap_script() {
  local s=/usr/share/debootstrap/scripts/$1
  [ -e "$s" ] && echo "$s" || echo /usr/share/debootstrap/scripts/sid
}

# What a chroot is made of: the suite, the mirror, the functions below that
# build it and the package list. Changes to the rest of this script (how a
# run mounts, say) keep the cached chroots.
stamp_of() {
  {
    echo "suite=$1 mirror=$mirror security=$security_mirror postgres=$(id -u postgres 2>/dev/null):$(id -g postgres 2>/dev/null)"
    declare -f previous_suite debootstrap_script configure_root refresh_from_host build_root
    cat "$clone/test/install-deps.sh"
  } | sha256sum | cut -d' ' -f1
}

# ---- mounts ----------------------------------------------------------------------------

mounted=()  # mount points, in mount order
mount_one() {
  local target=$1; shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounted+=("$target")
}

mount_all() {
  local root=$1
  mount_one "$root/proc" -t proc proc
  mount_one "$root/sys" -t sysfs -o ro sysfs
  mount_one "$root/dev/pts" -t devpts -o newinstance,ptmxmode=0666,mode=0620,gid=5 devpts
  mount_one "$root/dev/shm" -t tmpfs -o mode=1777,size=1g tmpfs
  mount_one "$root/src" --bind "$clone"
  mount -o remount,bind,ro "$root/src"
  mkdir -p "$port_dir" && chmod 1777 "$port_dir"
  mount_one "$root$port_dir" --bind "$port_dir"
}

# Processes left running in the chroot keep its mounts busy: end them by pid.
# They are those whose root is the chroot and, in a private namespace, that
# share it (another run of the same chroot has its own).
processes_inside() {
  local root=$1 own_ns p
  own_ns=$(readlink /proc/$$/ns/mnt)
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$(readlink "/proc/$p/root" 2>/dev/null)" = "$root" ] || continue
    [ "$namespace" = host ] || [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" = "$own_ns" ] || continue
    echo "$p"
  done
  return 0
}

end_processes_inside() {
  local root=$1 pids i
  mapfile -t pids < <(processes_inside "$root")
  [ ${#pids[@]} -eq 0 ] && return 0
  log "ending processes left in the chroot: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for i in $(seq 50); do
    mapfile -t pids < <(processes_inside "$root")
    [ ${#pids[@]} -eq 0 ] && return 0
    sleep 0.2
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
  sleep 0.5
}

unmount_all() {
  local root=$1 i target
  end_processes_inside "$root"
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    target=${mounted[i]}
    umount "$target" 2>/dev/null || umount -l "$target" || log "could not unmount $target"
  done
  mounted=()
}

# Whether anything is mounted at or below a directory, in this namespace.
mounts_below() {
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo
}

# ---- building --------------------------------------------------------------------------

# The chroot's configuration, written before any package is installed.
configure_root() {
  local root=$1 suite=$2
  # No service starts while packages install, and postgresql-NN creates no
  # cluster: the tests make their own.
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  mkdir -p "$root/etc/postgresql-common/createcluster.d"
  echo "create_main_cluster = false" >"$root/etc/postgresql-common/createcluster.d/billguard.conf"
  printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' \
    >"$root/etc/apt/apt.conf.d/90billguard"
  # A testing suite's Release may be older than its Valid-Until on a mirror:
  # the check is off for that suite alone.
  local valid=""
  [ "$suite" = forky ] && valid="Check-Valid-Until: no"
  rm -f "$root/etc/apt/sources.list"
  cat >"$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
$valid
EOF
  # The previous major (test/install-deps.sh installs it for pg_upgrade from
  # it) comes from the previous suite, pinned below this suite's packages so
  # that nothing this suite carries is taken from there. With the suite's
  # security updates, as a stable machine has them: its point release alone
  # may lag the server API the host's minor has (bookworm: 15.18, whose
  # headers lack have_createdb_privilege, against the host's 15.20).
  local previous
  previous=$(previous_suite "$suite")
  if [ -n "$previous" ]; then
    cat >"$root/etc/apt/sources.list.d/previous-major.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $previous
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security_mirror
Suites: $previous-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    printf 'Package: *\nPin: release n=%s\nPin-Priority: 100\n\nPackage: *\nPin: release n=%s-security\nPin-Priority: 100\n' \
      "$previous" "$previous" >"$root/etc/apt/preferences.d/billguard-previous-major"
  fi
  # The chroot's postgres has the host's uid and gid: both reserve ports for
  # PostgreSQL's test harness in one directory, and a reservation file of
  # another uid cannot be opened (the test dies).
  if id -u postgres >/dev/null 2>&1; then
    chroot "$root" groupadd --system -g "$(id -g postgres)" postgres
    chroot "$root" useradd --system -u "$(id -u postgres)" -g postgres -d /var/lib/postgresql \
      -s /bin/bash -c "PostgreSQL administrator" postgres
  fi
  # Its own devpts instance serves /dev/ptmx.
  rm -f "$root/dev/ptmx" && ln -s pts/ptmx "$root/dev/ptmx"
  mkdir -p "$root/src" "$root/build"
}

# What the chroot needs from the host on every entry: name resolution and the
# CA bundle that HTTPS out of this machine is verified with (npm uses it).
refresh_from_host() {
  local root=$1
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/billguard-host-ca.crt"
}

build_root() {
  local suite=$1 root=$2 new=$2.new
  rm_root "$new"
  log "building the $suite chroot in $new"
  if ! command -v debootstrap >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null; }
  fi
  local t0=$SECONDS
  run_waited debootstrap --variant=minbase --components=main --include=ca-certificates,rsync \
    "$suite" "$new" "$mirror" "$(debootstrap_script "$suite")" >"$cache/$suite.debootstrap.log" 2>&1 \
    || { tail -20 "$cache/$suite.debootstrap.log" >&2; die "debootstrap $suite failed (log: $cache/$suite.debootstrap.log)"; }
  log "debootstrap: $((SECONDS - t0)) s"
  configure_root "$new" "$suite"
  t0=$SECONDS
  in_root "$new" /src/test/install-deps.sh
  in_root "$new" sh -c 'apt-get clean && rm -rf /var/lib/apt/lists/*'
  log "packages: $((SECONDS - t0)) s"
  stamp_of "$suite" >"$new/.billguard-stamp"
  local old=$root.old
  rm_root "$old"
  [ -d "$root" ] && mv "$root" "$old"
  mv "$new" "$root"
  rm_root "$old"
}

upgrade_root() {
  local suite=$1 root=$2
  log "upgrading the $suite chroot (older than $max_age_days days)"
  in_root "$root" sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -qq &&
    apt-get dist-upgrade -y -qq >/dev/null && /src/test/install-deps.sh &&
    apt-get clean && rm -rf /var/lib/apt/lists/*'
  touch "$root/.billguard-stamp"
}

# Deletes a chroot, never through a mount: a bind mount of the clone or of
# the host's /tmp below it would be deleted with it.
rm_root() {
  local dir=$1
  [ -e "$dir" ] || return 0
  [ -z "$(mounts_below "$dir")" ] || die "$dir still has mounts: $(mounts_below "$dir" | tr '\n' ' ')"
  rm -rf --one-file-system "$dir"
}

# Runs a command in the background and waits for it, so that a signal
# reaches this script's trap at once rather than when the command ends. Its
# own process group (set -m) keeps it the default SIGINT and lets the trap
# end it whole.
child=""
run_waited() {
  local rc=0
  set -m
  "$@" 8>&- &
  child=$!
  set +m
  wait "$child" || rc=$?
  child=""
  return $rc
}

# Runs a command in a chroot with everything mounted, unmounting afterwards.
entered=""  # the chroot whose mounts are up
in_root() {
  local root=$1; shift
  refresh_from_host "$root"
  entered=$root
  mount_all "$root"
  local env=(PATH="/usr/lib/postgresql/$major/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    HOME=/root LANG=C.UTF-8 TERM="${TERM:-dumb}" CI="${CI:-}" BILLGUARD_IN_CHROOT="$suite"
    NODE_EXTRA_CA_CERTS=/etc/ssl/certs/billguard-host-ca.crt
    npm_config_cafile=/etc/ssl/certs/billguard-host-ca.crt
    PG_TEST_PORT_DIR="$port_dir")
  local name rc=0
  for name in $(compgen -e); do
    case $name in BILLGUARD_CHROOT_*) ;; BILLGUARD_* | TAP_TESTS | PG_TEST_* | PROVE_*) env+=("$name=${!name}") ;; esac
  done
  if [ "${interactive:-}" = 1 ]; then
    env -i "${env[@]}" chroot "$root" "$@" 8>&- || rc=$?
  else
    run_waited env -i "${env[@]}" chroot "$root" "$@" || rc=$?
  fi
  unmount_all "$root"
  entered=""
  return $rc
}

# Every exit path, a failure or a signal, ends what still runs and unmounts.
on_exit() {
  local rc=$?
  trap - EXIT HUP INT TERM
  [ -n "$child" ] && kill -TERM -- "-$child" 2>/dev/null
  [ -n "$entered" ] && unmount_all "$entered"
  exit $rc
}
trap on_exit EXIT
trap 'exit 129' HUP
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- commands --------------------------------------------------------------------------

ensure() {
  local major=$1 suite root
  suite=$(suite_of "$major")
  root=$cache/$suite
  mkdir -p "$cache"
  exec 8>"$cache/$suite.lock"
  flock -x 8
  local t0=$SECONDS
  if [ -f "$root/.billguard-stamp" ] && [ "$(cat "$root/.billguard-stamp")" = "$(stamp_of "$suite")" ]; then
    if [ -n "$(find "$root/.billguard-stamp" -mtime +"$max_age_days")" ]; then
      upgrade_root "$suite" "$root"
    else
      log "reusing the $suite chroot ($root)"
    fi
  else
    [ -d "$root" ] && log "the $suite chroot is stale (its script or package list changed): rebuilding"
    build_root "$suite" "$root"
  fi
  log "the $suite chroot is ready for PostgreSQL $major: $((SECONDS - t0)) s"
  flock -u 8
}

# Enters a private mount namespace once, then runs this script's command there.
in_namespace() {
  if [ "$namespace" = private ] && [ "${BILLGUARD_CHROOT_IN_NAMESPACE:-}" != 1 ]; then
    BILLGUARD_CHROOT_IN_NAMESPACE=1 exec unshare --mount --propagation private -- "$0" "$@"
  fi
}

[ "$(id -u)" = 0 ] || die "needs root (debootstrap, mount, chroot)"
cmd=${1:-}; major=${2:-}
[ -n "$cmd" ] && [ -n "$major" ] || die "usage: $0 ensure|run|shell|path|stamp|remove MAJOR [CMD...]"
suite=$(suite_of "$major")
root=$cache/$suite
case $cmd in
  path) echo "$root" ;;
  stamp) stamp_of "$suite" ;;
  ensure)
    in_namespace "$@"
    ensure "$major"
    ;;
  run | shell)
    in_namespace "$@"
    shift 2
    [ "$cmd" = shell ] && { interactive=1; set -- bash -l; }
    [ $# -gt 0 ] || die "run: no command"
    [ -f "$root/.billguard-stamp" ] || die "no $suite chroot: run $0 ensure $major first"
    # Shared: runs side by side; a rebuild (exclusive) waits for them.
    mkdir -p "$cache"
    exec 8>"$cache/$suite.lock"
    flock -s 8
    # Mounts in the host's namespace are shared by concurrent runs: one at a time.
    [ "$namespace" = host ] && { flock -u 8; flock -x 8; }
    in_root "$root" "$@"
    ;;
  remove)
    mkdir -p "$cache"
    exec 8>"$cache/$suite.lock"
    flock -x 8
    rm_root "$root"
    rm -f "$cache/$suite.debootstrap.log"
    ;;
  *) die "unknown command $cmd" ;;
esac
