# bash completion for fusebox (installed as
# share/bash-completion/completions/fusebox). The commands and each
# command's options are read from `fusebox help` and `fusebox help COMMAND`
# when completing, so they are always those of the installed fusebox.
_fusebox() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]} exe=${COMP_WORDS[0]}
  COMPREPLY=()
  if [ "$COMP_CWORD" -eq 1 ]; then
    local cmds
    cmds=$("$exe" help 2>/dev/null | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }')
    COMPREPLY=($(compgen -W "$cmds --version --help" -- "$cur"))
    return
  fi
  local cmd=${COMP_WORDS[1]}
  case $prev in
    --mode) COMPREPLY=($(compgen -W "sync async" -- "$cur")); return ;;
    --server | --param | --flush | --warmup | --repeat | --kernel | --bind | --modes | \
      --checkpoint-every) return ;;
    -o | --output-dir | --graph | --out | --checkpoint-dir) COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --trace | --json | --csv | --resume | --checkpoint-key) COMPREPLY=($(compgen -f -- "$cur")); return ;;
  esac
  if [ "$cmd" = help ]; then
    [ "$COMP_CWORD" -eq 2 ] || return
    COMPREPLY=($(compgen -W "$("$exe" help 2>/dev/null | sed -n '/^commands:/,/^$/p' |
                              awk 'NR > 1 && NF { print $1 }')" -- "$cur"))
    return
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$("$exe" help "$cmd" 2>/dev/null | grep -o -- '--\?-[a-zA-Z][a-z-]*' | sort -u)" -- "$cur"))
    return
  fi
  local exts
  case $cmd in
    run | bench | graph) exts='json' ;;
    check) exts='fbk json' ;;
    ir) exts='fbk' ;;
    *) return ;;
  esac
  compopt -o filenames 2>/dev/null
  COMPREPLY=($(compgen -d -- "$cur"))
  local e
  for e in $exts; do COMPREPLY+=($(compgen -f -X "!*.$e" -- "$cur")); done
}
complete -F _fusebox fusebox
