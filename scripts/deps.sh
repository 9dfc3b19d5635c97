#!/usr/bin/env bash
# Install Fusebox's build and test dependencies from Debian bookworm packages.
# Skips apt when every package is already installed (fast re-runs).
set -euo pipefail
PKGS=(build-essential cmake pkg-config llvm-19-dev clang-19 libclang-rt-19-dev libgrpc-dev
      libprotobuf-c-dev protobuf-c-compiler libjansson-dev libpng-dev check libseccomp-dev
      protobuf-compiler python3-grpcio python3-protobuf python3-pytest
      python3-numpy python3-pip python3-setuptools python3-wheel
      libssl-dev libmicrohttpd-dev openssl
      patchelf xz-utils   # patchelf, xz: scripts/gpu_bundle.sh
      nginx haproxy python3-yaml) # python/tests/test_replicas.py, test_deploy.py
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "fusebox: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
