#!/usr/bin/env bash
# Cuts the GPU host's dependency bundle (../shared/gpu-bundle/make-bundle.sh: two parts of
# about 43 MB) into three of about 29 MB, so that each upload, the working tree beside one
# piece, stays under the device tool's 64 MiB once the tree outgrows about 19 MiB.
#
#   bash scripts/gpu_bundle.sh [DEST]   (DEST defaults to .gpu3; add it to .git/info/exclude)
#
# On the GPU host, one call each, at once (a machine stays warm about 30 s):
#   1. carry DEST/1: mkdir -p /tmp/gpu-bundle && cp DEST/1/piece.00 /tmp/gpu-bundle/
#   2. carry DEST/2: cp DEST/2/piece.01 /tmp/gpu-bundle/
#   3. carry DEST/3: source DEST/3/join.sh   (rejoins the two parts, then sources unpack.sh)
set -euo pipefail
dest=${1:-.gpu3}
two=$(mktemp -d)
trap 'rm -rf "$two"' EXIT
bash "$(dirname "$0")/../../shared/gpu-bundle/make-bundle.sh" "$two" > /dev/null
cut=$(stat -c %s "$two/1/part.00")
cat "$two/1/part.00" "$two/2/part.01" > "$two/whole"
rm -rf "$dest"; mkdir -p "$dest/1" "$dest/2" "$dest/3"
split -n 3 -d -a 2 "$two/whole" "$dest/piece."
mv "$dest/piece.00" "$dest/1/"; mv "$dest/piece.01" "$dest/2/"; mv "$dest/piece.02" "$dest/3/"
cp "$two/2/unpack.sh" "$dest/3/"
cat > "$dest/3/join.sh" <<JOIN
# Source on the GPU host after pieces 00 and 01 reached /tmp/gpu-bundle (scripts/gpu_bundle.sh).
_j=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
if [ ! -f /tmp/gpu-site/.ready ]; then
  cat /tmp/gpu-bundle/piece.00 /tmp/gpu-bundle/piece.01 "\$_j/piece.02" > /tmp/gpu-bundle/whole || return 1
  head -c $cut /tmp/gpu-bundle/whole > /tmp/gpu-bundle/part.00
  tail -c +$((cut + 1)) /tmp/gpu-bundle/whole > "\$_j/part.01"
  rm -f /tmp/gpu-bundle/whole /tmp/gpu-bundle/piece.0[01]
fi
source "\$_j/unpack.sh"
unset _j
JOIN
du -sh "$dest"/*
