#!/usr/bin/env bash
# scripts/prerequisites.sh against stand-ins for dpkg-query, apt-get, id and python3: with everything
# present it installs nothing and says nothing; a missing package is installed with one line saying why
# (as root) or named in one line with the command to run (not root); a missing Python module, or one
# at a version outside its pinned range, is pip-installed.
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

# a Python package outside its pinned range is installed; at either end of it, nothing is. A
# safetensors of the given version and a pip that records its arguments lead /usr/bin/python3's path.
mkdir -p "$stubs/site/pip" "$stubs/site/safetensors"
touch "$stubs/site/safetensors/__init__.py" "$stubs/site/pip/__init__.py"
echo 'import os, sys; open(os.environ["CALLS"], "a").write("pip " + " ".join(sys.argv[1:]) + "\n")' >"$stubs/site/pip/__main__.py"
for case in 0.3.2:install 0.3.3:none 0.8.0:none 0.99.1:none 1.0.0:install; do
    version=${case%%:*}
    rm -rf "$stubs/site/"safetensors-*.dist-info && mkdir "$stubs/site/safetensors-$version.dist-info"
    printf 'Metadata-Version: 2.1\nName: safetensors\nVersion: %s\n' "$version" >"$stubs/site/safetensors-$version.dist-info/METADATA"
    MISSING="" UID_AS=0 PYTHONPATH="$stubs/site" run test
    [ $rc -eq 0 ] || fail "safetensors $version: rc $rc: $out"
    if [ "${case#*:}" = install ]; then
        grep -qx "prerequisites: installing safetensors>=0.3.3,<1 into /usr/bin/python3 (safetensors files, for the Hugging Face conversion tests)" <<<"$out" ||
            fail "safetensors $version: no line for it: $out"
        grep -qE "^pip install -q( --[a-z=-]+)* safetensors>=0.3.3,<1$" "$CALLS" || fail "safetensors $version: pip not asked: $(cat "$CALLS")"
    else
        [ -z "$out" ] && [ ! -s "$CALLS" ] || fail "safetensors $version is in range, yet: '$out', ran '$(cat "$CALLS")'"
    fi
done

bash scripts/prerequisites.sh nonsense >/dev/null 2>&1 && fail "a bad level was accepted"
echo "prerequisites script: all cases as expected"
