#!/usr/bin/env bash
# The README and docs/ as a reader follows them:
#   - every relative link in README.md and docs/*.md resolves: the file (or folder) exists, and a
#     #heading names a heading of that file, spelled as GitHub makes heading anchors
#   - README's flags table lists exactly the flags `./train_gpt --help` lists (a row may name a
#     flag by its short or its long name); the meanings and defaults are the README's to keep right
set -u
cd "$(dirname "$0")/.."
[ -x ./train_gpt ] || { echo "FAIL: ./train_gpt is not built (make train_gpt)"; exit 1; }
help=$(./train_gpt --help) || { echo "FAIL: ./train_gpt --help exited $?"; exit 1; }
python3 - "$help" <<'EOF'
import glob, os, re, sys

def unfenced(text):
    """the text less its fenced code blocks"""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)

def prose(text):
    """the text less its code, where brackets are not links"""
    return re.sub(r"`[^`\n]*`", "", unfenced(text))

def anchors(path):
    """the #anchors GitHub gives the headings of a markdown file"""
    seen, out = {}, set()
    for line in unfenced(open(path, encoding="utf-8").read()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out

failures = []
files = ["README.md"] + sorted(glob.glob("docs/*.md"))
for path in files:
    for target in re.findall(r"\]\(([^)\s]+)\)", prose(open(path, encoding="utf-8").read())):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(resolved):
            failures.append(f"{path}: link ({target}): no file {resolved}")
        elif anchor and (not resolved.endswith(".md") or anchor not in anchors(resolved)):
            failures.append(f"{path}: link ({target}): {resolved} has no heading #{anchor}")

# README's flags table: the rows after its header line, up to the first line that is not a row
readme = open("README.md", encoding="utf-8").read().splitlines()
try:
    start = readme.index("| flag | meaning | default |")
except ValueError:
    failures.append("README.md: no flags table (a line '| flag | meaning | default |')")
    start = len(readme)
documented = set()
for line in readme[start + 2:]:
    if not line.startswith("|"):
        break
    documented |= set(re.findall(r"`(-[^`\s]+)`", line.split("|")[1]))
listed = []  # --help's entries, each the names of one flag
for line in sys.argv[1].splitlines()[1:]:
    names = []
    for word in line.split():
        if not word.startswith("-"):
            break
        names.append(word)
    if names:
        listed.append(names)
if start < len(readme):
    for names in listed:
        if not documented & set(names):
            failures.append(f"README.md: the flags table has no row for {' '.join(names)} (--help lists it)")
    known = {n for names in listed for n in names}
    for name in sorted(documented - known):
        failures.append(f"README.md: the flags table names {name}, which --help does not list")

for f in failures:
    print("FAIL:", f)
if failures:
    sys.exit(1)
print(f"ok: {len(files)} files' links resolve; README's flags table names the {len(listed)} flags --help lists")
EOF
