#!/usr/bin/env bash
# Test a GPU bundle (scripts/gpu_bundle.sh) the way a bare GPU machine would
# see it, against the bundle's own fake CUDA driver:
#
#   bash scripts/gpu_bundle_test.sh fusebox-gpu.tar.xz [OUTDIR]
#
# 1. The archive is at most FB_BUNDLE_LIMIT_MIB (60) MiB.
# 2. It is unpacked, and in a mount namespace the system's libraries are
#    replaced by glibc's, libstdc++'s and libgcc's alone (plus what bash,
#    coreutils and python3 themselves need, listed as it starts), and
#    /usr/lib/llvm-19 by an empty folder: none of the build's packages
#    (LLVM, gRPC, protobuf-c, jansson, libmicrohttpd, libseccomp, OpenSSL)
#    can be found.
# 3. There, every bundled program must resolve every library from the bundle
#    or that set (ldd), and the bundle's gpu_check.sh --fake must pass: the
#    bundle's fuseboxd runs every example (CPU backend, checks passing; CUDA
#    backend through the fake driver), test_cuda, the differential tester's
#    big programs on the fake device and gpu_launch_bench.
# Without a mount namespace (unshare refused) it says so in capitals and runs
# step 3 with the system's libraries visible; that is not the same proof.
# The check's two report files go to OUTDIR (default: a temporary folder).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
tarball=$(realpath "${1:?usage: gpu_bundle_test.sh BUNDLE.tar.xz|UNPACKED-DIR [OUTDIR]}")
LIMIT_MIB=${FB_BUNDLE_LIMIT_MIB:-60}
say() { echo "gpu_bundle_test: $*" >&2; }
die() { say "FAILED: $*"; exit 1; }

work=$(mktemp -d /tmp/fb_bundle_test.XXXXXX)
trap 'rm -rf "$work"' EXIT
out=${2:-$work/out}
mkdir -p "$out"
out=$(realpath "$out")
if [ -d "$tarball" ]; then
  # An unpacked tree (FB_BUNDLE_BUILD/bundle/fusebox-gpu): no size to check.
  say "testing the unpacked tree $tarball (the archive's size is not checked)"
  B=$tarball
else
  size=$(stat -c %s "$tarball")
  mib=$(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }')
  [ "$size" -le $((LIMIT_MIB * 1048576)) ] || die "$tarball is $mib MiB, over the $LIMIT_MIB MiB limit"
  say "$tarball: $mib MiB (limit $LIMIT_MIB MiB)"
  xz -dc "$tarball" | tar -C "$work" -xf -
  B=$work/fusebox-gpu
fi
[ -x "$B/scripts/gpu_check.sh" ] || die "the bundle has no scripts/gpu_check.sh"

# What stays visible: glibc, the C++ runtime, and what the tools running the
# check (bash, coreutils, python3) load themselves.
allow=()
for pkg in libc6 libstdc++6 libgcc-s1; do
  while read -r f; do
    case "$f" in */lib/x86_64-linux-gnu/*.so*) [ -e "$f" ] && allow+=("$f") ;; esac
  done < <(dpkg -L "$pkg" 2>/dev/null)
done
[ ${#allow[@]} -gt 0 ] || die "dpkg -L libc6 listed nothing: this test needs a Debian-like system"
tool_libs=()
for t in bash sh env timeout sed grep awk cat ls mkdir rm mktemp dirname basename realpath readlink stat find wc \
         cp sort head tail tr id uname python3; do
  p=$(command -v "$t") || continue
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] && [ -e "$path" ] && tool_libs+=("$path")
  done < <(ldd "$(readlink -f "$p")" 2>/dev/null || true)
done

inner() {
  set -euo pipefail
  local lib=/usr/lib/x86_64-linux-gnu stage f
  stage=$(mktemp -d /tmp/fb_bundle_libs.XXXXXX)
  mount -t tmpfs tmpfs "$stage"
  for f in "${allow[@]}" "${tool_libs[@]}"; do
    cp -a "$f" "$stage/" 2>/dev/null || true
    cp -a "$(readlink -f "$f")" "$stage/" 2>/dev/null || true
  done
  for d in /usr/lib/llvm-19 /usr/local/lib; do
    if [ -d "$d" ]; then mount -t tmpfs tmpfs "$d"; fi
  done
  mount --bind "$stage" "$lib" # last: mount itself needs libmount
  # The build's libraries must be gone, bar those the tools load.
  local visible=()
  for f in "$B"/lib/*; do
    n=$(basename "$f")
    if [ -e "$lib/$n" ]; then visible+=("$n"); fi
  done
  say "hidden: $(( $(ls "$B/lib" | wc -l) - ${#visible[@]} )) of the bundle's $(ls "$B/lib" | wc -l) libraries (llvm, grpc, jansson, ...) are absent from the system now"
  [ ${#visible[@]} -eq 0 ] || say "still visible, because bash/coreutils/python3 load them: ${visible[*]}"
  for n in libLLVM.so.19.1 libgrpc.so.29 libjansson.so.4 libprotobuf-c.so.1 libseccomp.so.2 libmicrohttpd.so.12 libcrypto.so.3; do
    if [ -e "$lib/$n" ]; then die "$lib/$n is still visible: the namespace hides nothing"; fi
  done
  check_ldd
  bash "$B/scripts/gpu_check.sh" "$out" --fake
}

# Every bundled program takes each library from the bundle or glibc's set.
check_ldd() {
  local f name arrow path bad=0
  while read -r f; do
    while read -r name arrow path _; do
      [ "$arrow" = "=>" ] || continue
      [ "$path" = not ] || path=$(realpath -m "$path")
      case "$path" in
        "$B"/lib/*) ;;
        not) say "$f: $name not found"; bad=1 ;;
        *) case "$name" in
             libc.so.*|libm.so.*|libmvec.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|\
             ld-linux*|libstdc++.so.*|libgcc_s.so.*) ;;
             *) say "$f: $name comes from $path, outside the bundle"; bad=1 ;;
           esac ;;
      esac
    done < <(ldd "$f")
  done < <(find "$B/build" -type f \( -perm -u+x -o -name '*.so' \))
  [ $bad -eq 0 ] || die "bundled programs load libraries from outside the bundle"
  say "ldd: every bundled program takes its libraries from the bundle or glibc/libstdc++/libgcc"
}

export -f inner check_ldd say die
export B out
ns=()
if [ "$(id -u)" -eq 0 ] && unshare -m --propagation private true 2>/dev/null; then ns=(unshare -m --propagation private)
elif unshare -rm --propagation private true 2>/dev/null; then ns=(unshare -rm --propagation private)
fi
if [ ${#ns[@]} -gt 0 ]; then
  say "running the bundle in a mount namespace without the build's libraries (${ns[*]})"
  # Arrays do not cross into the child: hand them over as lines.
  printf '%s\n' "${allow[@]}" >"$work/allow"
  printf '%s\n' "${tool_libs[@]}" >"$work/tools"
  "${ns[@]}" bash -c 'mapfile -t allow <"$1"; mapfile -t tool_libs <"$2"; inner' _ "$work/allow" "$work/tools"
else
  err=$(unshare -rm true 2>&1 || true)
  say "WARNING: NO MOUNT NAMESPACE HERE (unshare: ${err:-refused}): the system's libraries stay visible,"
  say "WARNING: so this run shows only that ldd resolves the bundle's libraries from itself; it does not prove"
  say "WARNING: the bundle runs where they are missing. Run it where unshare works (root, or user namespaces)."
  check_ldd
  bash "$B/scripts/gpu_check.sh" "$out" --fake
fi
say "passed; the check's report: $out/gpu_check.md"
