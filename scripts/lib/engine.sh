# Sourced by the bench scripts (bench-matrix, bench-p99) and scripts/demo: the
# engine's database freshly migrated, and release engines started on it, each waited
# for until its /readyz answers and stopped again with SIGINT (the engine's graceful
# drain). The caller sets E to the engine binary and stops what it started with
# stop_engines (also on EXIT).

engine_pids=()

# The front stage verifies buyers' JWTs with this secret and the bench signs them
# with it (`frontstage.auth`): a throwaway one per run unless one is given.
if [[ -z ${SECKILL__FRONTSTAGE__AUTH__HS256_SECRET:-} ]]; then
  SECKILL__FRONTSTAGE__AUTH__HS256_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  export SECKILL__FRONTSTAGE__AUTH__HS256_SECRET
fi
# Purchase tokens are signed with another throwaway secret.
if [[ -z ${SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET:-} ]]; then
  SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')
  export SECKILL__FRONTSTAGE__PURCHASE_TOKEN__SECRET
fi
# A load generator's buyers all come from one address: the per-address limit is off
# for engines started here (the per-user limit stays on).
export SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S=${SECKILL__FRONTSTAGE__RATE_LIMIT__PER_ADDRESS_PER_S:-0}

# fresh_database: drop the engine's database and migrate it anew. Old rows slow
# PostgreSQL down and would blur a comparison between runs. `scripts/services psql`
# reads the database URL as the engine does (SECKILL__DATABASE__URL, else
# config/default.toml), so the drop reaches the server and name that `migrate` and
# `serve` then use.
fresh_database() {
  local out
  PGOPTIONS='-c client_min_messages=warning' scripts/services psql -q -v ON_ERROR_STOP=1 \
    <<<'DROP DATABASE IF EXISTS :"db" WITH (FORCE)' ||
    { echo "fresh_database: could not drop the engine's database" >&2; return 1; }
  out=$("$E" migrate 2>&1) || { printf '%s\n' "$out" >&2; return 1; }
}

# answers ADMIN PATH [STATUS]: GET http://ADMIN/PATH within a second; succeeds when
# anything answers (with STATUS: only that status). ADMIN is HOST:PORT, an IPv6 host
# in brackets ([::1]:9090). Bash's /dev/tcp, not curl, so that scripts/demo needs
# nothing the services script does not install.
answers() {
  local line host=${1%:*}
  host=${host#\[} host=${host%\]}
  line=$(timeout 1 bash -c 'exec 3<>"/dev/tcp/$1/$2" &&
    printf "GET /%s HTTP/1.0\r\nHost: %s\r\n\r\n" "$3" "$4" >&3 && head -n 1 <&3' \
    _ "$host" "${1##*:}" "$2" "$1" 2>/dev/null) || return 1
  [[ $line =~ ^HTTP/[0-9.]+\ ([0-9]+) ]] && [[ -z ${3:-} || ${BASH_REMATCH[1]} == "$3" ]]
}

# refuse_running_engine ADMIN...: fails, saying so, while anything answers on one of
# these admin addresses: an engine not started here would have its database dropped
# under it, and its /readyz taken for a new engine's. The scripts call it before they
# touch the database.
refuse_running_engine() {
  local admin
  for admin; do
    if answers "$admin" livez; then
      echo "something already answers on $admin; stop that engine first" >&2
      return 1
    fi
  done
}

# start_engine LOG ADMIN [NAME=VALUE...]: `serve` with those environment variables
# added, its output in LOG; returns once http://ADMIN/readyz answers 200 (60 s at
# most, or as soon as the engine exits). Refuses while something else answers on
# ADMIN: that engine's /readyz would be taken for this one's.
start_engine() {
  local log=$1 admin=$2
  shift 2
  refuse_running_engine "$admin" || return 1
  env "$@" RUST_LOG=warn "$E" serve >"$log" 2>&1 &
  local pid=$!
  engine_pids+=("$pid")
  for _ in $(seq 1 240); do
    answers "$admin" readyz 200 && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.25
  done
  tail -n 20 "$log" >&2
  echo "the engine (log $log) did not become ready on $admin" >&2
  return 1
}

# stop_engines: SIGINT to every engine started here, then wait for each to drain.
stop_engines() {
  local pid
  for pid in "${engine_pids[@]}"; do kill -INT "$pid" 2>/dev/null; done
  for pid in "${engine_pids[@]}"; do wait "$pid" 2>/dev/null; done
  engine_pids=()
}
