#!/usr/bin/env bash
# Build a self-contained Fusebox tree for a bare GPU machine and pack it.
#
#   bash scripts/gpu_bundle.sh [OUT.tar.xz]      (default: fusebox-gpu.tar.xz)
#
# Builds the programs the GPU check needs in a Release build directory
# (FB_BUNDLE_BUILD, default build-bundle; .ci/run points it at the Release
# build it already made), copies them with every shared library they load
# except glibc, libstdc++, libgcc_s and libcuda (which a GPU machine has),
# gives each an $ORIGIN run path into the tree's lib/ (patchelf), strips them,
# adds the examples, the benchmark sessions and scripts/gpu_check.sh, and packs
# it all as fusebox-gpu/ in OUT (xz -9e). Fails if OUT is over 60 MiB, the
# most the device tool carries with room to spare (docs/gpu.md).
#
# Environment: FB_BUNDLE_BUILD (build directory), FB_BUNDLE_STAGE (where the
# tree is assembled; default FB_BUNDLE_BUILD/bundle), FB_BUNDLE_XZ (xz options,
# default -9e), FB_BUNDLE_LIMIT_MIB (default 60).
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
OUT=${1:-fusebox-gpu.tar.xz}
case "$OUT" in /*) ;; *) OUT=$SRC/$OUT ;; esac
BUILD=${FB_BUNDLE_BUILD:-build-bundle}
STAGE=$(realpath -m "${FB_BUNDLE_STAGE:-$BUILD/bundle}")
XZOPT=${FB_BUNDLE_XZ:--9e}
LIMIT_MIB=${FB_BUNDLE_LIMIT_MIB:-60}
say() { echo "gpu_bundle: $*" >&2; }
die() { say "error: $*"; exit 1; }

for tool in patchelf strip xz ldd tar; do
  command -v "$tool" >/dev/null || die "$tool is missing (bash scripts/deps.sh installs it)"
done

# 1. The build. A build directory that is not Release would put sanitizer
# runtimes and unoptimized code in the bundle: refuse it.
if [ -f "$BUILD/CMakeCache.txt" ]; then
  bt=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
  san=$(sed -n 's/^FB_SANITIZE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")
  [ "$bt" = Release ] || die "$BUILD is a $bt build; the bundle needs a Release one (FB_BUNDLE_BUILD)"
  [ "$san" != ON ] || die "$BUILD is built with the sanitizers; the bundle needs a plain Release build"
else
  say "configuring a Release build in $BUILD"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache)
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFB_WERROR=ON "${launcher[@]}" >/dev/null
fi
# What the GPU check runs: the CUDA half of the suites (and test_cuda and
# test_ptx), the services, the launch benchmark and the fake driver.
TESTS=(test_engine test_lang_exec test_sparse test_async test_reduce test_differential test_cuda test_ptx)
PROGS=(server/fuseboxd client/fusebox bench/gpu_launch_bench)
say "building in $BUILD"
cmake --build "$BUILD" -j"$(nproc)" --target fuseboxd fusebox gpu_launch_bench fakecuda "${TESTS[@]}" >/dev/null

# 2. The tree: the build directory's shape (fusebox finds fuseboxd beside
# it, the tests find programs through FB_BUILD_DIR), lib/ beside it.
rm -rf "$STAGE"
T=$STAGE/fusebox-gpu
mkdir -p "$T/build/server" "$T/build/client" "$T/build/bench" "$T/build/tests/fakecuda" "$T/lib" \
         "$T/bench" "$T/scripts" "$T/docs"
for p in "${PROGS[@]}"; do cp "$BUILD/$p" "$T/build/$p"; done
for t in "${TESTS[@]}"; do cp "$BUILD/tests/$t" "$T/build/tests/$t"; done
cp "$BUILD/tests/fakecuda/libfakecuda.so" "$T/build/tests/fakecuda/"
cp -r examples "$T/"
cp -r bench/micro bench/large bench/real "$T/bench/"
cp scripts/gpu_check.sh scripts/gpu_check.py "$T/scripts/"
cp docs/gpu.md "$T/docs/"
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+changes"
{
  echo "commit $commit"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), glibc $(ldd --version | head -1 | awk '{print $NF}')"
  echo "build $(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt")"
} > "$T/BUNDLE"

# 3. Shared libraries: every one ldd resolves, outside the machine's own set.
# The pattern names what a GPU machine is expected to have (glibc's parts,
# the C++ runtime, the driver).
SYSTEM_RE='^(linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnss_[a-z]*\.so|libstdc\+\+\.so|libgcc_s\.so|libcuda\.so)'
mapfile -t elves < <(find "$T/build" -type f \( -perm -u+x -o -name '*.so' \) | sort)
declare -A seen=()
for f in "${elves[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $SYSTEM_RE ]] && continue
    [ "$path" != "not" ] || die "$f: $name not found on this machine"
    [ -n "${seen[$name]:-}" ] && continue
    seen[$name]=1
    cp -L "$path" "$T/lib/$name"
    chmod u+w "$T/lib/$name"
  done < <(ldd "$f")
done
say "copied ${#seen[@]} shared libraries"

# 4. Run paths: each program and library finds lib/ relative to itself, and
# nothing else; strip what a GPU machine does not need (symbols, debug info).
for f in "${elves[@]}" "$T"/lib/*; do
  rel=$(realpath --relative-to="$(dirname "$f")" "$T/lib")
  strip --strip-unneeded "$f" 2>/dev/null || say "warning: cannot strip $f"
  if [ "$rel" = . ]; then patchelf --set-rpath '$ORIGIN' "$f"; else patchelf --set-rpath "\$ORIGIN/$rel" "$f"; fi
done
# A program must now resolve every library from the tree or the system set.
for f in "${elves[@]}"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    [[ "$name" =~ $SYSTEM_RE ]] && continue
    case "$(realpath -m "$path")" in "$T"/lib/*) ;; *) die "$f loads $name from $path, outside the bundle" ;; esac
  done < <(ldd "$f")
done

# 5. Pack and measure.
raw=$(du -sb "$T" | cut -f1)
say "packing $((raw / 1048576)) MiB with xz $XZOPT into $OUT"
mkdir -p "$(dirname "$OUT")"
tar -C "$STAGE" --owner=0 --group=0 --sort=name -cf - fusebox-gpu | xz $XZOPT -T1 -c > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
size=$(stat -c %s "$OUT")
mib=$(awk -v s="$size" 'BEGIN { printf "%.1f", s / 1048576 }')
say "$OUT: $mib MiB compressed ($((raw / 1048576)) MiB unpacked; limit $LIMIT_MIB MiB)"
if [ "$size" -gt $((LIMIT_MIB * 1048576)) ]; then
  du -b "$T"/lib/* "$T"/build/*/* 2>/dev/null | sort -n | tail -8 >&2
  die "the bundle is $mib MiB, over the $LIMIT_MIB MiB limit (largest files above)"
fi
