#!/usr/bin/env bash
# Installs the Debian packages rstar needs on a fresh machine, only those that are missing.
#   python3-torch + libopenblas0-pthread : the PyTorch backend (CPU) through /usr/bin/python3
#   redis-server                         : the sandbox's scale-out queue (tests start their own)
#   bubblewrap                           : namespaces for the sandbox's isolation
#   chromium                             : the browser the viewer's tests drive (rstar view)
set -euo pipefail
packages=(python3-torch libopenblas0-pthread redis-server bubblewrap chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "rstar setup: missing Debian packages; run as root:" >&2
  echo "  apt-get update && apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "rstar setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
