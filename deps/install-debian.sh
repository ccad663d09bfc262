#!/usr/bin/env bash
# Install the pinned Debian packages listed in the given files (default deps/debian-packages.txt)
# that are not installed yet.
# A pinned version the mirror no longer carries (a security update replaced it) falls back to the
# mirror's candidate with a warning rather than failing the build. Services that packages would start
# (mosquitto on port 1883) are kept from starting: tests and benches start their own on free ports.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lists=("$@")
[[ ${#lists[@]} -eq 0 ]] && lists=("$here/debian-packages.txt")
want=()
while read -r line; do
    spec="${line%%#*}"; spec="$(echo "$spec" | xargs)"
    [[ -z "$spec" ]] && continue
    pkg="${spec%%=*}"
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        want+=("$spec")
    fi
done < <(cat "${lists[@]}")
[[ ${#want[@]} -eq 0 ]] && exit 0
SUDO=""
if [[ "$(id -u)" != 0 ]]; then SUDO="sudo"; fi
echo "installing Debian packages: ${want[*]}"
policy=/usr/sbin/policy-rc.d
made_policy=0
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee $policy >/dev/null && $SUDO chmod +x $policy && made_policy=1
fi
cleanup() { if [[ $made_policy == 1 ]]; then $SUDO rm -f $policy; fi; }
trap cleanup EXIT
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if ! $SUDO apt-get install -y -qq --no-install-recommends "${want[@]}"; then
    echo "warning: pinned versions unavailable; installing the mirror's candidates" >&2
    $SUDO apt-get install -y -qq --no-install-recommends "${want[@]%%=*}"
fi
