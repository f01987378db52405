#!/usr/bin/env bash
# scripts/prerequisites.sh against stand-ins for dpkg-query, apt-get, id and python3: with everything
# present it installs nothing and says nothing; a missing package is installed with one line saying why
# (as root) or named in one line with the command to run (not root); a missing Python module is pip-installed.
set -euo pipefail
cd "$(dirname "$0")/.."
stubs=$(mktemp -d); trap 'rm -rf "$stubs"' EXIT
real_python=$(command -v python3)
fail() { echo "FAIL: $*"; exit 1; }

# dpkg-query reports every package installed except those in $MISSING
cat >"$stubs/dpkg-query" <<'STUB'
#!/usr/bin/env bash
shift 2
status=0
for p in "$@"; do if [[ " $MISSING " == *" $p "* ]]; then status=1; else echo "$p ii"; fi; done
exit $status
STUB
cat >"$stubs/apt-get" <<'STUB'
#!/usr/bin/env bash
echo "apt-get $*" >>"$CALLS"
STUB
cat >"$stubs/id" <<'STUB'
#!/usr/bin/env bash
echo "$UID_AS"
STUB
# python3 without its site-packages (-S) lacks numpy and tiktoken; pip calls are recorded, not run
cat >"$stubs/python3" <<STUB
#!/usr/bin/env bash
if [ "\${NO_SITE:-}" = 1 ] && [ "\$1 \$2" = "-m pip" ]; then echo "pip \$*" >>"\$CALLS"; exit 0; fi
if [ "\${NO_SITE:-}" = 1 ]; then exec "$real_python" -S "\$@"; fi
exec "$real_python" "\$@"
STUB
chmod +x "$stubs"/*
export PATH="$stubs:$PATH" CALLS="$stubs/calls"

run() {  # LEVEL: runs the script, output in $out, status in $rc
    : >"$CALLS"
    set +e; out=$(bash scripts/prerequisites.sh "$1" 2>&1); rc=$?; set -e
}

MISSING="" UID_AS=0 run test
[ $rc -eq 0 ] && [ -z "$out" ] && [ ! -s "$CALLS" ] || fail "all present: rc $rc, said '$out', ran '$(cat "$CALLS")'"

MISSING="libgtest-dev openmpi-bin" UID_AS=0 run test
[ $rc -eq 0 ] || fail "root install: rc $rc: $out"
grep -qx "prerequisites: installing openmpi-bin (mpirun, to start ranks)" <<<"$out" || fail "no line for openmpi-bin: $out"
grep -qx "prerequisites: installing libgtest-dev (GoogleTest, for the test binaries)" <<<"$out" || fail "no line for libgtest-dev: $out"
grep -q "^apt-get install .* openmpi-bin libgtest-dev$" "$CALLS" || fail "apt-get not asked for both: $(cat "$CALLS")"

MISSING="libgtest-dev" UID_AS=0 run build
[ $rc -eq 0 ] && [ -z "$out" ] || fail "build level wanted a test package: $out"

MISSING="libgtest-dev" UID_AS=1000 run test
[ $rc -eq 1 ] || fail "not root: rc $rc"
[ "$out" = "prerequisites: missing libgtest-dev; run: sudo apt-get install -y libgtest-dev" ] || fail "not root said: $out"
[ ! -s "$CALLS" ] || fail "not root still ran: $(cat "$CALLS")"

MISSING="" UID_AS=0 NO_SITE=1 run build
[ $rc -eq 0 ] || fail "pip install: rc $rc: $out"
grep -q "^prerequisites: installing tiktoken into .*python3 (GPT-2's BPE tokenizer, for the data scripts)$" <<<"$out" || fail "no line for tiktoken: $out"
grep -qE "^pip -m pip install -q( --[a-z=-]+)* numpy tiktoken$" "$CALLS" || fail "pip not asked for numpy and tiktoken: $(cat "$CALLS")"

bash scripts/prerequisites.sh nonsense >/dev/null 2>&1 && fail "a bad level was accepted"
echo "prerequisites script: all cases as expected"
