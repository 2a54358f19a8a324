#!/usr/bin/env bash
# bootstrap.sh - install what provisioner and its tests need on a fresh Debian 12 machine (as root):
# the Debian packages (only those missing) and a project-local virtualenv (.venv) with the pinned Python tools.
# Safe to run again: each step checks first. Usage: bash scripts/bootstrap.sh [--lab]
#   --lab   also the lab's host packages (podman, runc, debootstrap, ...), for `provision lab up`
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[bootstrap %(%T)T] %s\n' -1 "$*" >&2; }

packages=(python3 python3-venv python3-pip git ca-certificates gnupg dpkg-dev openssh-client)
if [[ ${1:-} == --lab ]]; then
  packages+=(podman runc netavark aardvark-dns iptables debootstrap zstd uidmap)
fi
if [[ ${PROVISIONER_WITH_CHROMIUM:-0} == 1 ]]; then
  packages+=(chromium)
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    log "missing Debian packages: ${missing[*]} (run as root, or install them)"; exit 2
  fi
  log "apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

py=${PROVISIONER_PYTHON:-python3}
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { log "$py is older than 3.11"; exit 2; }
if [[ ! -x .venv/bin/python ]]; then
  log "creating .venv"
  "$py" -m venv .venv
fi
stamp=.venv/.provisioner-stamp
want=$(cat requirements/lock.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ ! -f $stamp || $(cat "$stamp") != "$want" ]]; then
  # Every package from the lock, each checked against its recorded hashes (pip refuses anything unpinned or
  # unhashed), then the package itself in editable mode without resolving anything again: what CI and every
  # developer run is exactly requirements/lock.txt, whatever the package index serves today.
  log "pip install --require-hashes -r requirements/lock.txt, then provisioner (editable)"
  pip() {  # pip without its find-links noise; fails when pip fails
    .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v '^WARNING: Location' || true; }
    return "${PIPESTATUS[0]}"
  }
  pip install --require-hashes --no-deps -r requirements/lock.txt || { log "pip install of the lock failed"; exit 2; }
  pip install --no-deps --no-build-isolation -e . || { log "pip install -e . failed"; exit 2; }
  (cd / && "$OLDPWD/.venv/bin/python" -c 'import provisioner, ansible_runner, paramiko, netmiko') \
    || { log "the installed environment does not import"; exit 2; }
  echo "$want" >"$stamp"
fi
log "ready: .venv"
