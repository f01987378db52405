#!/usr/bin/env bash
# `make gpu-rehearsal`: scripts/gpu_check.sh run here as the lent GPU machine would run it, before
# a device call is spent on it. Root only (it uses mount and network namespaces); nothing on this
# machine changes. It packs .deps/ (gpu_check.sh --pack), copies what a device call carries (the
# files git tracks or would track, as a fresh clone has them once committed, and .deps/), and
# runs gpu_check.sh on that copy in a sandbox:
#   - GoogleTest, OpenMPI (with PMIx, hwloc, libevent, munge) and OpenBLAS are gone: their Debian
#     packages' files are hidden under an overlay of /usr, /etc/openmpi under an empty folder
#   - dpkg, dpkg-query, apt-get, apt and pip fail, python3 -m pip too; no network but loopback
#   - a fresh empty /tmp; no GPU (none here)
# It passes when gpu_check.sh builds everything, says SKIP for every GPU test, and exits with
# its "no GPU" status (77); the ZeRO tests' SKIP lines say how many ranks mpirun started.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "gpu_rehearsal: needs root, for its mount and network namespaces" >&2; exit 2; }
bash scripts/gpu_check.sh --pack
box=$(mktemp -d /var/tmp/gpu_rehearsal_XXXXXX)
trap 'rm -rf "$box"' EXIT
mkdir -p "$box/tree" "$box/out" "$box/shims" "$box/empty" "$box/usr" "$box/usr.upper" "$box/usr.work"
git ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do if [ -e "$f" ]; then printf '%s\0' "$f"; fi; done |
    tar --null -T - -cf - | tar -C "$box/tree" -xf -
cp -a .deps "$box/tree/"
carried=$(du -sb "$box/tree" | cut -f1)
echo "a device call would carry $((carried / 1024)) KiB: the tree and .deps/ ($(du -sh .deps | cut -f1)), of 64 MiB"
[ "$carried" -le $((64 << 20)) ] || { echo "gpu rehearsal FAILED: over the 64 MiB a device call carries"; exit 1; }

# what the GPU machine lacks, as Debian packages
mapfile -t gone < <(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' libgtest-dev libgmock-dev googletest \
    'openmpi-*' 'libopenmpi*' 'libpmix*' 'libhwloc*' 'libevent-*' 'libmunge*' 'libopenblas*' 'libblas*' 'liblapack*' \
    2>/dev/null | awk '$1 == "ii" { print $2 }')
dpkg -L "${gone[@]}" | sed -E 's#^/(lib|bin|sbin)/#/usr/\1/#' | grep '^/usr/' | sort -u >"$box/gone.txt"

for tool in dpkg dpkg-query apt-get apt pip pip3; do
    printf '#!/bin/sh\necho "rehearsal: %s is not available on the GPU machine" >&2\nexit 1\n' "$tool" >"$box/shims/$tool"
done
cat >"$box/shims/python3" <<EOF
#!/bin/sh
if [ "\${1:-}" = -m ] && [ "\${2:-}" = pip ]; then echo "rehearsal: pip is not available on the GPU machine" >&2; exit 1; fi
exec $(command -v python3) "\$@"
EOF
chmod +x "$box/shims"/*

set +e
unshare --mount --net --propagation private env -i HOME="$HOME" PATH="$box/shims:$PATH" BOX="$box" bash -c '
    set -e
    ip link set lo up
    mount -t overlay overlay -o "lowerdir=/usr,upperdir=$BOX/usr.upper,workdir=$BOX/usr.work" "$BOX/usr"
    mount --bind "$BOX/usr" /usr
    while IFS= read -r f; do if [ -L "$f" ] || [ -f "$f" ]; then rm -f "$f"; fi; done <"$BOX/gone.txt"
    tac "$BOX/gone.txt" | while IFS= read -r d; do if [ -d "$d" ]; then rmdir "$d" 2>/dev/null || true; fi; done
    find /usr/bin /usr/lib/x86_64-linux-gnu /usr/include -xtype l -delete  # links into what is gone (alternatives)
    if [ -d /etc/openmpi ]; then mount --bind "$BOX/empty" /etc/openmpi; fi
    mount -t tmpfs tmpfs /tmp
    cd "$BOX/tree" && OUT="$BOX/out" bash scripts/gpu_check.sh'
rc=$?
set -e

fail() { echo "gpu rehearsal FAILED: $*"; exit 1; }
summary=$box/out/gpu_summary.txt
[ -s "$summary" ] || fail "gpu_check.sh left no summary in \$OUT"
echo "== gpu_check.sh exited $rc; the summary it left in \$OUT:"
cat "$summary"
! grep -q '^FAIL' "$summary" || fail "a FAIL line"
mkdir "$box/logs" && tar -xzf "$box/out/gpu_check_logs.tgz" -C "$box/logs"
! grep -E 'warning( #|:)' "$box/logs"/build_*.log || fail "warnings in the build (above)"
[ $rc -eq 77 ] || fail "exit status $rc, not 77 (no GPU)"
for want in "kernels+model bf16" "kernels+model fp32" "ZeRO 0-3, 2 ranks" "ZeRO 0-3, 3 ranks" "NCCL" "benchmarks"; do
    grep -q "^SKIP  $want.*(no GPU)" "$summary" || fail "no 'SKIP  $want ... (no GPU)' line"
done
grep -q "^SKIP  ZeRO 0-3, 3 ranks.*(no GPU), 3 ranks started" "$summary" || fail "mpirun did not start 3 ranks"
echo "gpu rehearsal passed: built from a copy of the tree and .deps/ ($(du -sh "$box/tree/.deps" | cut -f1)) with no package manager, every GPU test skipped"
