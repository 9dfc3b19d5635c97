#!/bin/sh
# `cmake --install` into a temporary prefix: pkg-config finds libfusebox
# there (fusebox.pc is relocatable: its paths come from where it lies, also
# after the tree is moved), and examples/c/saxpy_client.c compiles against
# the installed headers and library and runs against the installed fuseboxd;
# the manual pages, bash completion and documentation are installed.
# usage: test_install.sh BUILD_DIR SOURCE_DIR [EXTRA_CFLAGS]
set -eu
build=$1 src=$2 extra=${3:-}
tmp=$(mktemp -d /tmp/fbinstall.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$tmp/p" >"$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "cmake --install"; }
pc=$(find "$tmp/p" -name fusebox.pc)
[ -n "$pc" ] || fail "no fusebox.pc under $tmp/p"
libdir=$(dirname "$(dirname "$pc")")

# Every -I and -L of libfusebox itself lies inside the prefix.
check_flags() { # PREFIX
  flags=$(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs fusebox) || fail "pkg-config"
  echo "pkg-config: $flags"
  inc=$(printf '%s\n' $flags | sed -n 's/^-I//p' | head -1)
  lib=$(printf '%s\n' $flags | sed -n 's/^-L//p' | head -1)
  [ -n "$inc" ] && [ -n "$lib" ] || fail "no -I or -L in: $flags"
  inc=$(realpath "$inc") lib=$(realpath "$lib") pre=$(realpath "$1")
  case $inc in "$pre"/*) ;; *) fail "-I$inc is not inside $pre" ;; esac
  case $lib in "$pre"/*) ;; *) fail "-L$lib is not inside $pre" ;; esac
  [ -f "$inc/fusebox/client.h" ] || fail "no fusebox/client.h in $inc"
  # every header the public ones include is installed; the engine's is not
  # (libfusebox does not link the engine)
  for h in $(sed -n 's/^#include "\(fusebox\/[a-z]*\.h\)".*/\1/p' "$inc"/fusebox/*.h | sort -u); do
    [ -f "$inc/$h" ] || fail "an installed header includes $h, which is not installed"
  done
  [ ! -e "$inc/fusebox/engine.h" ] || fail "fusebox/engine.h is installed, but libfusebox has no engine"
  ls "$lib"/libfusebox.so* >/dev/null 2>&1 || fail "no libfusebox.so in $lib"
}
check_flags "$tmp/p"

# The example client, built against the installed tree only.
cc=${CC:-cc}
# shellcheck disable=SC2086
$cc -std=c11 -Wall -Werror $extra "$src/examples/c/saxpy_client.c" -o "$tmp/saxpy_client" \
  $(PKG_CONFIG_PATH=$(dirname "$pc") pkg-config --cflags --libs fusebox) -Wl,-rpath,"$libdir" \
  || fail "examples/c/saxpy_client.c does not build against the installed tree"
out=$(env -u FUSEBOX_SERVER FUSEBOXD="$tmp/p/bin/fuseboxd" "$tmp/saxpy_client" 2>&1) \
  || { echo "$out"; fail "saxpy_client failed"; }
echo "$out"
case $out in *"sum(y) = 3072 "*) ;; *) fail "unexpected output from saxpy_client" ;; esac

# The manual pages (made from the help text), bash completion and docs.
man1=$tmp/p/share/man/man1
for prog in fusebox fuseboxd; do
  [ -s "$man1/$prog.1" ] || fail "no $man1/$prog.1"
done
grep -q '^\.TH FUSEBOX 1' "$man1/fusebox.1" || fail "fusebox.1 has no .TH line"
for c in check ir run bench graph ping stats; do # a section per command, with its usage
  grep -q "^\.SS $c\$" "$man1/fusebox.1" || fail "fusebox.1 has no section for $c"
  grep -q "^usage: fusebox $c " "$man1/fusebox.1" || fail "fusebox.1 lacks the usage of $c"
done
grep -q 'output\\-dir' "$man1/fusebox.1" || fail "fusebox.1 lacks run's --output-dir"
grep -q 'socket\\-mode' "$man1/fuseboxd.1" || fail "fuseboxd.1 lacks --socket-mode"
if command -v groff >/dev/null 2>&1; then
  warn=$(groff -man -Tutf8 -ww -z "$man1/fusebox.1" 2>&1) || fail "groff: $warn"
  [ -z "$warn" ] || fail "groff warns about fusebox.1: $warn"
fi
comp=$tmp/p/share/bash-completion/completions/fusebox
[ -s "$comp" ] || fail "no $comp"
if command -v bash >/dev/null 2>&1; then
  words=$(PATH=$tmp/p/bin:$PATH bash -c '. "$1"; COMP_WORDS=(fusebox ru); COMP_CWORD=1; _fusebox
          echo "${COMPREPLY[*]}"; COMP_WORDS=(fusebox run --out); COMP_CWORD=2; _fusebox
          echo "${COMPREPLY[*]}"' sh "$comp") || fail "the completion script fails"
  case $words in "run"*"--output-dir"*) ;; *) fail "completion gave: $words" ;; esac
fi
doc=$tmp/p/share/doc/fusebox
for f in README.md docs/sessions.md docs/language.md docs/images/wave_080.png \
         bench/RESULTS.md examples/heat.json examples/c/saxpy_client.c; do
  [ -s "$doc/$f" ] || fail "no $doc/$f"
done
# Every relative link of the installed documents (a path with a '/' or naming
# a .md or .png file) resolves in the installed tree.
nlinks=0
for md in "$doc/README.md" "$doc"/docs/*.md; do
  dir=$(dirname "$md")
  for link in $(grep -o '](\([A-Za-z0-9_./-]*\))' "$md" | sed 's/^](//; s/)$//'); do
    case $link in */*|*.md|*.png) ;; *) continue ;; esac
    nlinks=$((nlinks + 1))
    [ -e "$dir/$link" ] || fail "$(basename "$md") links to $link, which is not installed"
  done
done
[ "$nlinks" -ge 5 ] || fail "found only $nlinks relative links in the installed documents"

# Moved elsewhere, the tree still describes itself.
mv "$tmp/p" "$tmp/moved"
pc=$(find "$tmp/moved" -name fusebox.pc)
check_flags "$tmp/moved"
echo "ok"
