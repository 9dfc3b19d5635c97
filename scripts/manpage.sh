#!/bin/sh
# Manual pages made at build time from the help text of the built programs,
# so that a page says exactly what --help says and cannot drift from it:
#   manpage.sh fusebox  EXE OUT.1 VERSION   `fusebox help`, then `fusebox help
#                                           COMMAND` for each command it lists
#   manpage.sh fuseboxd EXE OUT.1 VERSION   `fuseboxd --help`
set -eu
name=$1 exe=$2 out=$3 version=$4
tmp=$out.tmp

# roff-safe text: backslashes, minus signs (so that options copy and paste),
# and lines that would read as requests
esc() { sed -e 's/\\/\\e/g' -e 's/-/\\-/g' -e "s/^\([.']\)/\\\\\&\1/"; }

header() { # SUMMARY
  upper=$(printf '%s' "$name" | tr '[:lower:]' '[:upper:]')
  echo ".TH $upper 1 \"\" \"$name $version\" \"Fusebox\""
  echo ".SH NAME"
  echo "$name \\- $1"
}

files() {
  echo ".SH FILES"
  echo "The documentation (Markdown: sessions.md for JSON sessions, language.md"
  echo "for the language, security.md, design.md) and the examples are installed"
  echo "in share/doc/fusebox under the installation prefix."
}

fusebox_page() {
  general=$("$exe" help)
  commands=$(printf '%s\n' "$general" | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }' |
             grep -v -x -e help -e version)
  [ -n "$commands" ] || { echo "manpage.sh: no commands in '$exe help'" >&2; exit 1; }
  header "check, run and benchmark Fusebox programs and sessions, locally or on a fuseboxd"
  echo ".SH SYNOPSIS"
  echo ".nf"
  printf '%s\n' "$general" | sed -n '/^usage:/,/^$/p' | sed '/^$/d; s/^usage: *//; s/^ *//' | esc
  echo ".fi"
  echo ".SH DESCRIPTION"
  echo ".nf"
  printf '%s\n' "$general" | sed '1,/^$/d' | esc
  echo ".fi"
  echo ".SH COMMANDS"
  for c in $commands; do
    echo ".SS $c"
    echo ".nf"
    "$exe" help "$c" | esc
    echo ".fi"
  done
  files
  echo ".SH SEE ALSO"
  echo ".BR fuseboxd (1)"
}

fuseboxd_page() {
  help=$("$exe" --help)
  header "the Fusebox compute server (gRPC)"
  echo ".SH SYNOPSIS"
  echo ".nf"
  printf '%s\n' "$help" | sed -n '1s/^usage: *//p' | esc
  echo ".fi"
  echo ".SH OPTIONS"
  echo ".nf"
  printf '%s\n' "$help" | sed '1d' | esc
  echo ".fi"
  files
  echo ".SH SEE ALSO"
  echo ".BR fusebox (1)"
}

case $name in
  fusebox) fusebox_page >"$tmp" ;;
  fuseboxd) fuseboxd_page >"$tmp" ;;
  *) echo "manpage.sh: no page for '$name'" >&2; exit 2 ;;
esac
mv "$tmp" "$out"
