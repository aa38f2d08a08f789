#!/usr/bin/env bash
# What orders accelfs after the store it reads, and what bounds the warm-up (systemd/):
#   - the fstab example, through systemd's own fstab generator: a network mount (remote-fs.target)
#     that requires the mount holding SOURCE (RequiresMountsFor=SOURCE);
#   - accelfs-generator: for each /etc/accelfs/NAME.conf a drop-in of accelfs@NAME.service with
#     RequiresMountsFor=ACCELFS_SOURCE (quotes, spaces and '%' kept), none for a conf without an
#     absolute ACCELFS_SOURCE, exit 0 whatever it finds; systemd-analyze verify loads the instance
#     with the drop-in without a complaint;
#   - accelfs-warm@.service: a finite TimeoutStartSec, and its ExecStopPost prints the failure line
#     when the start timed out (SERVICE_RESULT=timeout) and nothing otherwise.
# Needs no build: the units are configured here from the .in files. Skips (77) without systemd's
# tools (systemd-analyze, the fstab generator).
#
#   tests/systemd/ordering_test.sh SOURCE_DIR
set -euo pipefail
if (($# != 1)); then
  echo "usage: $0 SOURCE_DIR" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
fstab_generator=/lib/systemd/system-generators/systemd-fstab-generator
if ! command -v systemd-analyze >/dev/null || [[ ! -x $fstab_generator ]]; then
  echo "ordering_test: SKIPPED: no systemd-analyze or $fstab_generator"
  exit 77
fi
work=$(mktemp -d /tmp/accelfs-ordering-test.XXXXXX)
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "ordering_test: FAIL: $*" >&2
  failures=$((failures + 1))
}

# The fstab example, as systemd turns it into a mount unit at boot.
mkdir "$work/fstab-out"
grep -v '^#' "$src/systemd/fstab.example" | grep . >"$work/fstab"
[[ $(wc -l <"$work/fstab") == 1 ]] || fail "fstab.example has not exactly one line: $(cat "$work/fstab")"
read -r what where type options _ <"$work/fstab"
[[ $type == fuse.accelfs ]] || fail "fstab.example's type is $type"
[[ ,$options, == *,_netdev,* ]] || fail "fstab.example lacks _netdev: $options"
[[ ,$options, == *",x-systemd.requires-mounts-for=$what,"* ]] ||
  fail "fstab.example lacks x-systemd.requires-mounts-for=$what: $options"
SYSTEMD_FSTAB=$work/fstab SYSTEMD_PROC_CMDLINE='' "$fstab_generator" \
  "$work/fstab-out" "$work/fstab-out" "$work/fstab-out" 2>"$work/fstab.log" ||
  fail "systemd-fstab-generator: $(cat "$work/fstab.log")"
mount_unit=$(systemd-escape -p --suffix=mount "$where")
grep -qx "RequiresMountsFor=$what" "$work/fstab-out/$mount_unit" 2>/dev/null ||
  fail "$mount_unit has no RequiresMountsFor=$what: $(cat "$work/fstab-out/$mount_unit" 2>&1)"
[[ -e $work/fstab-out/remote-fs.target.wants/$mount_unit ||
  -e $work/fstab-out/remote-fs.target.requires/$mount_unit ]] ||
  fail "$mount_unit is not a network mount (remote-fs.target): $(find "$work/fstab-out")"

# The units as installed, with their binaries replaced by /bin/true (verify wants executables).
mkdir -p "$work/bin" "$work/units"
ln -s /bin/true "$work/bin/accelfs"
ln -s /bin/true "$work/bin/accelfs-warm"
for unit in accelfs@.service accelfs-warm@.service; do
  sed "s|@ACCELFS_BINDIR@|$work/bin|g" "$src/systemd/$unit.in" >"$work/units/$unit"
done

# accelfs-generator over three confs.
mkdir "$work/conf" "$work/gen"
printf 'ACCELFS_SOURCE=/workspace/models\nACCELFS_MOUNTPOINT=/mnt/fastmodels\n' >"$work/conf/models.conf"
printf 'ACCELFS_SOURCE = "/data/my models/100%%"\n' >"$work/conf/odd.conf"
printf 'ACCELFS_MOUNTPOINT=/mnt/other\n' >"$work/conf/nosource.conf"
ACCELFS_CONF_DIR=$work/conf "$src/systemd/accelfs-generator" "$work/gen" "$work/gen" "$work/gen" ||
  fail "accelfs-generator exited $?"
dropin=$work/gen/accelfs@models.service.d/50-accelfs-source.conf
grep -qx 'RequiresMountsFor="/workspace/models"' "$dropin" 2>/dev/null ||
  fail "no RequiresMountsFor=\"/workspace/models\" in $dropin: $(cat "$dropin" 2>&1)"
grep -qx 'RequiresMountsFor="/data/my models/100%%"' \
  "$work/gen/accelfs@odd.service.d/50-accelfs-source.conf" 2>/dev/null ||
  fail "odd.conf's drop-in: $(cat "$work/gen/accelfs@odd.service.d/50-accelfs-source.conf" 2>&1)"
[[ ! -e $work/gen/accelfs@nosource.service.d ]] || fail "a drop-in for a conf without ACCELFS_SOURCE"
ACCELFS_CONF_DIR=$work/missing "$src/systemd/accelfs-generator" "$work/gen2" || fail "no conf dir: exit $?"
"$src/systemd/accelfs-generator" || fail "no arguments: exit $?"

# The instance with its drop-in loads cleanly (a parse error of RequiresMountsFor= is a complaint).
cp -r "$work/gen/accelfs@models.service.d" "$work/units/"
cp "$work/units/accelfs@.service" "$work/units/accelfs@models.service"
verify=$(SYSTEMD_UNIT_PATH="$work/units:" systemd-analyze verify --man=no \
  "$work/units/accelfs@models.service" "$work/units/accelfs-warm@.service" 2>&1) ||
  fail "systemd-analyze verify: $verify"
if grep -i -e accelfs -e requiresmountsfor <<<"$verify"; then
  fail "systemd-analyze verify complains about our units: $verify"
fi

# accelfs-warm@: a finite start timeout, and its failure line.
timeout=$(sed -n 's/^TimeoutStartSec=//p' "$work/units/accelfs-warm@.service")
[[ -n $timeout && $timeout != infinity && $timeout != 0 ]] ||
  fail "accelfs-warm@.service's TimeoutStartSec is '${timeout}', not a finite time"
stop_post=$(sed -n 's/^ExecStopPost=//p' "$work/units/accelfs-warm@.service")
[[ $stop_post == "/bin/sh -c '"*"'" ]] || fail "accelfs-warm@'s ExecStopPost is not /bin/sh -c '...': $stop_post"
script=${stop_post#"/bin/sh -c '"}
script=${script%"'"}
script=${script//%i/models}
script=${script//\$\$/\$}
said=$(SERVICE_RESULT=timeout ACCELFS_WARM=/mnt/fastmodels/Qwen3-27B ACCELFS_MOUNTPOINT=/mnt/fastmodels \
  sh -c "$script" 2>&1) || fail "ExecStopPost exited $? on a timeout"
want="accelfs-warm@models: gave up after TimeoutStartSec"
[[ $said == "$want"*"the store did not deliver /mnt/fastmodels/Qwen3-27B into the cache of accelfs@models"* ]] ||
  fail "ExecStopPost on a timeout said: $said"
said=$(SERVICE_RESULT=success sh -c "$script" 2>&1) || fail "ExecStopPost exited $? on success"
[[ -z $said ]] || fail "ExecStopPost on success said: $said"

if ((failures)); then
  exit 1
fi
echo "ordering_test: passed"
