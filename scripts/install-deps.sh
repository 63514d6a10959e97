#!/usr/bin/env bash
# Installs the Debian packages in scripts/debian-packages.txt that are not installed yet.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
list="$here/debian-packages.txt"
# Read in the shell, not through a process substitution, whose failure set -e cannot see: an
# unreadable list must stop the build, not count as "all 0 packages present".
[[ -r "$list" ]] || { echo "install-deps: cannot read $list" >&2; exit 1; }
pkgs=()
while read -r line || [[ -n "$line" ]]; do
  [[ "$line" =~ ^[[:space:]]*(#|$) ]] || pkgs+=("$line")
done < "$list"
((${#pkgs[@]} > 0)) || { echo "install-deps: $list names no package" >&2; exit 1; }
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
sudo=""
[[ $(id -u) -eq 0 ]] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
