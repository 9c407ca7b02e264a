#!/usr/bin/env bash
# Shared helpers for recipes: logging to stderr, deterministic shuffles, reading one JSON field.

log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
step() { log "== $*"; }
die() {
  log "error: $*"
  exit 1
}

# shuffle_lines FILE SEED: a seeded (reproducible) permutation of FILE's lines.
# (coreutils + awk: awk's seeded generator is shuf's byte source.)
shuffle_lines() {
  shuf --random-source=<(awk -v seed="$2" 'BEGIN { srand(seed); while (1) printf "%c", int(rand() * 256) }' 2>/dev/null) "$1"
}

# json_number JSON KEY: a top-level numeric field of a one-line JSON object, without a process.
json_number() {
  local re="\"$2\": ?(-?[0-9.]+([eE][-+]?[0-9]+)?)"
  [[ $1 =~ $re ]] && printf '%s' "${BASH_REMATCH[1]}"
}

# adapter_base FOLDER: the base checkpoint a LoRA adapter folder names (adapter_config.json's
# base_model_name_or_path, as PEFT writes it); dies naming the file and field when it is not a folder here.
adapter_base() {
  local config=$1/adapter_config.json base
  base=$(node -e 'const c = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
    const b = c.base_model_name_or_path; process.stdout.write(typeof b === "string" ? b : "")' "$config") ||
    die "$config: not readable JSON"
  [[ -n $base ]] || die "$config: base_model_name_or_path: missing (the base this adapter trains on)"
  [[ -f $base/config.json ]] || die "$config: base_model_name_or_path: $base is not a checkpoint folder here"
  printf '%s' "$base"
}

# sft_data SFT_RUN: the data folder an SFT run (recipes/sft.sh OUT) was made from: the folder its
# manifest's RSTAR_SFT_DATA names when it reused one, else its own OUT/data.
sft_data() {
  local data
  data=$(sed -n 's/^RSTAR_SFT_DATA=//p' "$1/manifest.txt" 2>/dev/null | tail -n 1)
  data=${data:-$1/data}
  [[ -f $data/test-problems.jsonl ]] || die "$1: its data folder $data has no test-problems.jsonl"
  printf '%s' "$data"
}

# check_manifest FILE EARLIER FRESH_DIR NAME=VALUE...: a recipe reuses what its OUT holds (a
# checkpoint, evaluations, a stage's steps) only when it was made with the same settings. FILE lists
# the settings of the run that made it, one NAME=VALUE a line, NAME the environment variable that
# sets it; a new OUT gets this run's. When FILE names other values, or is missing while EARLIER=1
# (OUT already holds output), the recipe stops before anything runs, naming each setting that
# differs; with RSTAR_FRESH=1 it deletes FRESH_DIR instead and starts afresh (FRESH_DIR empty: the
# recipe cannot tell what to delete, and refuses). RSTAR_CHECK_ONLY=1 checks and writes nothing.
check_manifest() {
  local file=$1 earlier=$2 fresh_dir=$3 line name
  shift 3
  local -A had=()
  local -a differ=()
  if [[ -f $file ]]; then
    while IFS= read -r line; do [[ $line == *=* ]] && had[${line%%=*}]=${line#*=}; done <"$file"
    for line in "$@"; do
      name=${line%%=*}
      if [[ ! -v had[$name] ]]; then
        differ+=("$name: not recorded there; '${line#*=}' now")
      elif [[ ${had[$name]} != "${line#*=}" ]]; then
        differ+=("$name: '${had[$name]}' there; '${line#*=}' now")
      fi
      unset "had[$name]"
    done
    for name in "${!had[@]}"; do differ+=("$name: '${had[$name]}' there; not a setting now"); done
  elif [[ $earlier == 1 ]]; then
    differ+=("no $(basename "$file"): made by an earlier version of the recipe, or by hand")
  fi
  if ((${#differ[@]} > 0)); then
    # never the working folder or one above it (OUT given as `.`)
    if [[ -n $fresh_dir ]] && ! deletable "$fresh_dir"; then fresh_dir=; fi
    if [[ ${RSTAR_FRESH:-0} == 1 && -n $fresh_dir && ${RSTAR_CHECK_ONLY:-0} != 1 ]]; then
      log "RSTAR_FRESH=1: deleting $fresh_dir, made with other settings (${differ[*]})"
      rm -rf -- "$fresh_dir"
    else
      log "error: $(dirname "$file") holds output made with other settings, which this run would reuse:"
      for line in "${differ[@]}"; do log "  $line"; done
      if [[ -n $fresh_dir ]]; then
        die "give it another folder, or RSTAR_FRESH=1 to delete $fresh_dir and start afresh"
      fi
      die "give it another folder, or delete $(dirname "$file") to start afresh"
    fi
  fi
  [[ ${RSTAR_CHECK_ONLY:-0} == 1 ]] && return 0
  mkdir -p "$(dirname "$file")"
  printf '%s\n' "$@" >"$file"
}

# deletable DIR: DIR exists and is neither the working folder nor above it (OUT given as `.`).
deletable() {
  local resolved
  resolved=$(cd "$1" 2>/dev/null && pwd) || return 1
  [[ $PWD/ != "${resolved%/}"/* ]]
}

# occupied DIR: DIR exists and holds anything.
occupied() { [[ -d $1 && -n $(ls -A "$1") ]]; }

# trap_interrupts HINT: Ctrl-C or SIGTERM stops this recipe's children (servers included) quietly
# and exits 130 with one line, "interrupted; rerun to HINT's output". A recipe another one runs
# (demo.sh runs sft.sh and rl.sh; one Ctrl-C reaches them all) leaves the line to the outermost.
# Ctrl-C reaches every process of the terminal's process group; a SIGTERM sent to the recipe's own
# pid (a supervisor, `kill PID`) reaches the recipe alone, which passes it on to every process it
# started. Bash runs a trap only once its foreground command has exited, so a recipe runs its long
# steps with `child`, whose `wait` a signal interrupts at once.
trap_interrupts() {
  INTERRUPT_HINT=$1
  export RSTAR_RECIPE_TOP=${RSTAR_RECIPE_TOP:-$$}
  trap 'interrupted INT' INT
  trap 'interrupted TERM' TERM
}
interrupted() {
  trap '' INT TERM
  # Ctrl-C has reached the pipeline's members already; a SIGTERM has not
  if [[ $1 == TERM ]]; then stop_children; fi
  if declare -F stop_servers >/dev/null; then stop_servers; fi
  local pids
  pids=$(jobs -p)
  # shellcheck disable=SC2086
  [[ -z $pids ]] || kill -TERM $pids 2>/dev/null || true
  wait 2>/dev/null || true
  [[ $RSTAR_RECIPE_TOP != "$$" ]] || log "interrupted; rerun to $($INTERRUPT_HINT)"
  exit 130
}

# child COMMAND...: runs a long step (an rstar command, a nested recipe, a shell function) as a
# child of the recipe and waits for it, so that a trapped SIGTERM interrupts the wait (see
# trap_interrupts). Stdin stays the recipe's, and the command gets SIGINT back (a script's
# background commands ignore it), so Ctrl-C still reaches a nested recipe as it did.
child() {
  if declare -F "$1" >/dev/null; then
    "$@" <&0 &
  else
    env --default-signal=INT,QUIT "$@" <&0 &
  fi
  wait "$!"
}

# descendants: the pids of every live process under this recipe (children, theirs, and so on),
# but its servers and theirs (SERVER_PIDS: stop_servers stops them, in order), from /proc.
descendants() {
  local stat line pid ppid state self=$BASHPID
  local -A under=() skip=()
  for pid in ${SERVER_PIDS[@]+"${SERVER_PIDS[@]}"}; do skip[$pid]=1; done
  for stat in /proc/[0-9]*/stat; do
    { read -r line <"$stat"; } 2>/dev/null || continue
    pid=${line%% *}
    line=${line##*) } # after the command name, which may hold spaces: "STATE PPID ..."
    state=${line%% *}
    line=${line#* }
    ppid=${line%% *}
    [[ $state != Z && $pid != "$self" ]] && under[$ppid]+=" $pid"
  done
  local -a queue=("$$") found=()
  while ((${#queue[@]} > 0)); do
    pid=${queue[0]}
    queue=("${queue[@]:1}")
    for line in ${under[$pid]:-}; do
      [[ -v skip[$line] ]] && continue
      found+=("$line")
      queue+=("$line")
    done
  done
  echo "${found[*]}"
}

# alive PID: PID is a process, and not one that has exited (a zombie nobody has reaped yet).
alive() {
  local line
  { read -r line <"/proc/$1/stat"; } 2>/dev/null || return 1
  line=${line##*) }
  [[ ${line%% *} != Z ]]
}

# stop_children: SIGTERM at once to every process under the recipe but its servers (descendants),
# as Ctrl-C reaches the whole process group, then waits until they are gone (10 s at most).
stop_children() {
  local pids pid tenths=0
  pids=$(descendants)
  [[ -n $pids ]] || return 0
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for pid in $pids; do
    while alive "$pid" && ((tenths++ < 200)); do sleep 0.05; done
  done
}

# last_step DIR FIRST LAST: the last complete checkpoint DIR/step-K with FIRST <= K <= LAST, else FIRST - 1.
last_step() {
  local dir k last=$(($2 - 1))
  for dir in "$1"/step-*/; do
    k=${dir%/}
    k=${k##*/step-}
    [[ $k =~ ^[0-9]+$ && -f $dir/trainer_state.json ]] || continue
    ((k >= $2 && k <= $3 && k > last)) && last=$k
  done
  echo "$last"
}
