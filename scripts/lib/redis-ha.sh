# shellcheck shell=bash
# Sourced by scripts/services (up --redis-ha, down, status, redis-ha-kill-master,
# redis-ha-restart): a local Redis high-availability topology. Five redis-server
# processes, each with its files under $RHA_DIR/<name>:
#   r0, r1      data servers; r0 starts as the master, r1 as its replica. Both
#               persist (appendonly yes, appendfsync everysec): the point of the
#               profile is surviving the loss of a server.
#   s1, s2, s3  Redis Sentinels monitoring the master under the name `seckill`,
#               quorum 2, down-after-milliseconds 1000, failover-timeout 5000 (a
#               fast fail-over for tests).
# Sentinel rewrites its own file and the servers' replicaof lines on a fail-over, so
# the files are the topology's state: `up` writes a file only when it creates it,
# and sets a server's replicaof line only when it starts that server (as the master
# the sentinels name, or as its replica: never a second master). Writes the engine
# settings to $SVC_DIR/redis-ha.toml.
#
# The caller defines SVC_DIR, ROOT and the helpers of scripts/services (pid_alive,
# pid_is, wait_pid_gone, now_us, since). SECKILL_REDIS_HA_PORTS (default "56379
# 56380 56381 56382 56383": r0, r1, s1, s2, s3) gives the ports; they are recorded
# in $RHA_DIR/ports at the first `up` and read from there afterwards.

RHA_DIR=${SVC_DIR:?}/redis-ha
RHA_SERVERS=(r0 r1)
RHA_SENTINELS=(s1 s2 s3)
RHA_ALL=(r0 r1 s1 s2 s3)
RHA_MASTER_NAME=seckill
RHA_TIMEOUT=${SERVICES_START_TIMEOUT:-120}

rha_say() { printf '%-9s %s\n' "$1:" "$2"; }
rha_die() { printf 'redis-ha: error: %s\n' "$*" >&2; exit 1; }

rha_ports() {
  if [[ -s $RHA_DIR/ports ]]; then cat "$RHA_DIR/ports"; else echo "${SECKILL_REDIS_HA_PORTS:-56379 56380 56381 56382 56383}"; fi
}

rha_port() { # rha_port r0|r1|s1|s2|s3
  local ports i
  read -r -a ports <<<"$(rha_ports)"
  case $1 in r0) i=0 ;; r1) i=1 ;; s1) i=2 ;; s2) i=3 ;; s3) i=4 ;; *) return 1 ;; esac
  echo "${ports[$i]}"
}

rha_server_of() { # rha_server_of PORT: the data server (r0 or r1) on PORT
  local n
  for n in "${RHA_SERVERS[@]}"; do
    [[ $(rha_port "$n") == "$1" ]] && { echo "$n"; return 0; }
  done
  return 1
}

rha_is_sentinel() { [[ $1 == s* ]]; }

# rha_cli PORT ARGS...: the raw reply, empty if nothing answers within 3 s.
rha_cli() { timeout 3 redis-cli --raw -h 127.0.0.1 -p "$1" "${@:2}" 2>/dev/null || true; }

rha_answers() { [[ $(rha_cli "$(rha_port "$1")" PING) == PONG ]]; }

rha_pid() { # rha_pid NAME: the pid of its running process, or fails
  local pid
  pid=$(cat "$RHA_DIR/$1/redis.pid" 2>/dev/null) || return 1
  pid_is "$pid" redis-server || return 1
  echo "$pid"
}

# rha_info PORT SECTION FIELD: one field of INFO SECTION.
rha_info() { rha_cli "$1" INFO "$2" | tr -d '\r' | sed -n "s/^$3://p"; }

# rha_sentinel_field SENTINEL_PORT FIELD: one field of SENTINEL MASTER seckill.
rha_sentinel_field() {
  rha_cli "$1" SENTINEL MASTER "$RHA_MASTER_NAME" | awk -v f="$2" 'prev == f { print; exit } { prev = $0 }'
}

# rha_sentinel_says SENTINEL_PORT: the port of the master that sentinel names.
rha_sentinel_says() {
  rha_cli "$1" SENTINEL GET-MASTER-ADDR-BY-NAME "$RHA_MASTER_NAME" | sed -n 2p
}

# rha_sentinel_replica SENTINEL_PORT REPLICA_PORT: how that sentinel sees the
# replica: "FLAGS ROLE LINK MASTER_PORT", e.g. "slave slave ok 56379"; empty if unknown.
rha_sentinel_replica() {
  rha_cli "$1" SENTINEL REPLICAS "$RHA_MASTER_NAME" | tr -d '\r' | awk -v p="$2" '
    NR % 2 == 1 { k = $0; next }
    k == "name" { if (port == p) exit; port = ""; flags = ""; role = ""; link = ""; mp = "" }
    k == "port" { port = $0 } k == "flags" { flags = $0 } k == "role-reported" { role = $0 }
    k == "master-link-status" { link = $0 } k == "master-port" { mp = $0 }
    END { if (port == p) print flags, role, link, mp }'
}

# rha_sentinels_see_replica REPLICA_PORT MASTER_PORT: every sentinel sees that
# replica healthy (no s_down, connected) and linked to MASTER_PORT, so that it would
# promote it if the master died.
rha_sentinels_see_replica() {
  local s
  for s in "${RHA_SENTINELS[@]}"; do
    [[ $(rha_sentinel_replica "$(rha_port "$s")" "$1") == "slave slave ok $2" ]] || return 1
  done
}

# rha_agreed_master: the master's port if every sentinel answers and names the same
# one; fails otherwise.
rha_agreed_master() {
  local s p m=
  for s in "${RHA_SENTINELS[@]}"; do
    p=$(rha_sentinel_says "$(rha_port "$s")")
    [[ -n $p && ( -z $m || $p == "$m" ) ]] || return 1
    m=$p
  done
  echo "$m"
}

# rha_known_master: the master's port as the sentinels know it: from the first one
# that answers, else from the sentinel file with the newest configuration epoch (a
# sentinel rewrites its `sentinel monitor` line on a fail-over), else r0.
rha_known_master() {
  local s p best=-1 epoch conf m=
  for s in "${RHA_SENTINELS[@]}"; do
    p=$(rha_sentinel_says "$(rha_port "$s")")
    [[ -n $p ]] && { echo "$p"; return 0; }
  done
  for s in "${RHA_SENTINELS[@]}"; do
    conf=$RHA_DIR/$s/sentinel.conf
    [[ -r $conf ]] || continue
    p=$(awk -v n="$RHA_MASTER_NAME" '$1 == "sentinel" && $2 == "monitor" && $3 == n { print $5; exit }' "$conf")
    epoch=$(awk -v n="$RHA_MASTER_NAME" '$1 == "sentinel" && $2 == "config-epoch" && $3 == n { print $4; exit }' "$conf")
    [[ $p =~ ^[0-9]+$ ]] || continue
    [[ $epoch =~ ^[0-9]+$ ]] || epoch=0
    if ((epoch > best)); then best=$epoch m=$p; fi
  done
  if [[ -n $m ]]; then echo "$m"; else rha_port r0; fi
}

# rha_set_replicaof SERVER [MASTER_PORT]: the server's file names MASTER_PORT as its
# master, or no master at all (the server is the master).
rha_set_replicaof() {
  local conf=$RHA_DIR/$1/redis.conf
  sed -i -E '/^[[:space:]]*(replicaof|slaveof)[[:space:]]/d' "$conf"
  [[ -z ${2:-} ]] || echo "replicaof 127.0.0.1 $2" >>"$conf"
}

rha_write_server_conf() { # rha_write_server_conf SERVER
  local n=$1 dir=$RHA_DIR/$1
  [[ -s $dir/redis.conf ]] && return 0
  mkdir -p "$dir"
  cat >"$dir/redis.conf" <<EOF
# generated by scripts/lib/redis-ha.sh; Sentinel rewrites the replicaof line on a
# fail-over (CONFIG REWRITE), and 'up' / 'redis-ha-restart' set it on a start.
bind 127.0.0.1
port $(rha_port "$n")
daemonize yes
dir "$dir"
logfile "$dir/redis.log"
pidfile "$dir/redis.pid"
appendonly yes
appendfsync everysec
save ""
# A (re)joining replica syncs at once, not after the default 5 s wait for others.
repl-diskless-sync-delay 0
EOF
  # A new replica follows r0, the master the sentinels' new files name.
  [[ $n == r0 ]] || echo "replicaof 127.0.0.1 $(rha_port r0)" >>"$dir/redis.conf"
}

rha_write_sentinel_conf() { # rha_write_sentinel_conf SENTINEL
  local n=$1 dir=$RHA_DIR/$1
  [[ -s $dir/sentinel.conf ]] && return 0
  mkdir -p "$dir"
  cat >"$dir/sentinel.conf" <<EOF
# generated by scripts/lib/redis-ha.sh; the sentinel rewrites this file (its id,
# the current master, the replicas and other sentinels it found).
bind 127.0.0.1
port $(rha_port "$n")
daemonize yes
dir "$dir"
logfile "$dir/sentinel.log"
pidfile "$dir/redis.pid"
sentinel monitor $RHA_MASTER_NAME 127.0.0.1 $(rha_port r0) 2
sentinel down-after-milliseconds $RHA_MASTER_NAME 1000
sentinel failover-timeout $RHA_MASTER_NAME 5000
sentinel parallel-syncs $RHA_MASTER_NAME 1
EOF
}

# rha_start NAME: starts a stopped server or sentinel and waits until it answers.
rha_start() {
  local n=$1 port dir=$RHA_DIR/$1 log conf args=() deadline pid
  port=$(rha_port "$n")
  if rha_is_sentinel "$n"; then
    conf=$dir/sentinel.conf log=$dir/sentinel.log args=(--sentinel)
  else
    conf=$dir/redis.conf log=$dir/redis.log
  fi
  # Something else on the port (a server this directory did not start)?
  [[ -z $(rha_cli "$port" PING) ]] || rha_die "$n: 127.0.0.1:$port already answers, but not as a process started from $(rel "$dir"); stop it first"
  rm -f "$dir/redis.pid"
  : >>"$log"
  redis-server "$conf" "${args[@]}" >>"$log" 2>&1 </dev/null ||
    { tail -n 15 "$log" | sed 's/^/  | /' >&2; rha_die "$n: redis-server failed to start; see $(rel "$log")"; }
  deadline=$((SECONDS + RHA_TIMEOUT))
  until rha_answers "$n"; do
    pid=$(cat "$dir/redis.pid" 2>/dev/null) || pid=
    if [[ -n $pid ]] && ! pid_alive "$pid"; then
      tail -n 15 "$log" | sed 's/^/  | /' >&2
      rha_die "$n exited during startup; see $(rel "$log")"
    fi
    ((SECONDS < deadline)) || { tail -n 15 "$log" | sed 's/^/  | /' >&2; rha_die "$n did not answer on port $port within ${RHA_TIMEOUT}s"; }
    sleep 0.1
  done
}

rha_running_servers() { # the data servers whose process runs
  local n
  for n in "${RHA_SERVERS[@]}"; do rha_pid "$n" >/dev/null && echo "$n"; done
  return 0
}

rha_answering_sentinels() {
  local n
  for n in "${RHA_SENTINELS[@]}"; do rha_answers "$n" && echo "$n"; done
  return 0
}

rha_stop() { # rha_stop NAME: SIGTERM (the AOF is flushed), SIGKILL after 30 s
  local pid
  pid=$(rha_pid "$1") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  if ! wait_pid_gone "$pid" 30; then
    kill -KILL "$pid" 2>/dev/null || true
    wait_pid_gone "$pid" 10 || rha_die "$1: pid $pid does not stop"
  fi
  rha_say "$1" "stopped (port $(rha_port "$1"))"
}

# rha_ready: every process answers; the sentinels agree on a master that answers as
# one; each sentinel knows the other two (else there is no quorum); every other
# server streams from the master, and every sentinel sees it as a healthy replica
# (else there is nothing to promote).
rha_ready() {
  local m n p
  for n in "${RHA_ALL[@]}"; do rha_answers "$n" || return 1; done
  m=$(rha_agreed_master) || return 1
  [[ $(rha_info "$m" replication role) == master ]] || return 1
  for n in "${RHA_SENTINELS[@]}"; do
    p=$(rha_port "$n")
    [[ $(rha_sentinel_field "$p" num-other-sentinels) == 2 ]] || return 1
  done
  for n in "${RHA_SERVERS[@]}"; do
    p=$(rha_port "$n")
    [[ $p == "$m" ]] && continue
    [[ $(rha_info "$p" replication master_port) == "$m" &&
      $(rha_info "$p" replication master_link_status) == up ]] || return 1
    rha_sentinels_see_replica "$p" "$m" || return 1
  done
  echo "$m"
}

rha_write_config() { # rha_write_config MASTER_PORT
  local s list=
  for s in "${RHA_SENTINELS[@]}"; do list+="${list:+, }\"redis://127.0.0.1:$(rha_port "$s")\""; done
  cat >"$SVC_DIR/redis-ha.toml" <<EOF
# Engine settings for the local Redis HA topology (scripts/services up --redis-ha);
# use with --config. The engine asks the sentinels for the master named
# master_name; url is the master at the time of the last 'up', kept for tools that
# want one address.
[redis]
url = "redis://127.0.0.1:$1"
sentinels = [$list]
master_name = "$RHA_MASTER_NAME"
EOF
}

rha_check_ports() {
  local ports p seen=" "
  read -r -a ports <<<"$(rha_ports)"
  ((${#ports[@]} == 5)) || rha_die "SECKILL_REDIS_HA_PORTS needs five ports (r0 r1 s1 s2 s3), got '${ports[*]}'"
  for p in "${ports[@]}"; do
    if ! [[ $p =~ ^[0-9]+$ ]] || ((p < 1 || p > 65535)); then rha_die "bad port '$p' in '${ports[*]}'"; fi
    [[ $seen != *" $p "* ]] || rha_die "port $p given twice in '${ports[*]}'"
    seen+="$p "
  done
}

rha_up() {
  local t0 n m started=0 deadline
  t0=$(now_us)
  if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
    rha_die "redis-server and redis-cli are needed (Debian package redis-server)"
  fi
  rha_check_ports
  mkdir -p "$RHA_DIR"
  [[ -s $RHA_DIR/ports ]] || rha_ports >"$RHA_DIR/ports"
  for n in "${RHA_SERVERS[@]}"; do rha_write_server_conf "$n"; done
  for n in "${RHA_SENTINELS[@]}"; do rha_write_sentinel_conf "$n"; done
  if m=$(rha_ready); then
    rha_write_config "$m"
    rha_say redis-ha "all five answer, master 127.0.0.1:$m; reusing them ($(since "$t0")); settings in $(rel "$SVC_DIR/redis-ha.toml")"
    return 0
  fi
  # The servers first: the master the sentinels know, then the others as its replicas.
  m=$(rha_known_master)
  n=$(rha_server_of "$m") || rha_die "the sentinels name 127.0.0.1:$m as the master, not a server of this topology"
  # The master they name is dead while another server runs: a fail-over is under
  # way (or due); starting the dead one as a master would make two.
  if ! rha_pid "$n" >/dev/null &&
    [[ -n $(rha_running_servers) ]] && [[ -n $(rha_answering_sentinels) ]]; then
    rha_say redis-ha "the master $n (port $m) is down and a sentinel runs: waiting for the fail-over"
    deadline=$((SECONDS + RHA_TIMEOUT))
    until m=$(rha_agreed_master) && [[ $m != "$(rha_port "$n")" ]]; do
      ((SECONDS < deadline)) || rha_die "the sentinels did not fail over from $n (port $(rha_port "$n")) within ${RHA_TIMEOUT}s; see $(rel "$RHA_DIR")/s*/sentinel.log"
      sleep 0.2
    done
  fi
  for n in "${RHA_SERVERS[@]}"; do
    [[ $(rha_port "$n") == "$m" ]] || continue
    if ! rha_pid "$n" >/dev/null; then
      rha_set_replicaof "$n"
      rha_say "$n" "starting as the master on 127.0.0.1:$m (data $(rel "$RHA_DIR/$n"))"
      rha_start "$n"
      started=1
    fi
  done
  for n in "${RHA_SERVERS[@]}"; do
    [[ $(rha_port "$n") == "$m" ]] && continue
    if ! rha_pid "$n" >/dev/null; then
      rha_set_replicaof "$n" "$m"
      rha_say "$n" "starting as a replica of 127.0.0.1:$m on 127.0.0.1:$(rha_port "$n") (data $(rel "$RHA_DIR/$n"))"
      rha_start "$n"
      started=1
    fi
  done
  for n in "${RHA_SENTINELS[@]}"; do
    if ! rha_pid "$n" >/dev/null; then
      rha_say "$n" "starting a sentinel on 127.0.0.1:$(rha_port "$n")"
      rha_start "$n"
      started=1
    fi
  done
  ((started)) || rha_say redis-ha "all five processes run; waiting for the sentinels to agree"
  deadline=$((SECONDS + RHA_TIMEOUT))
  until m=$(rha_ready); do
    if ((SECONDS >= deadline)); then
      rha_status >&2 || true
      rha_die "the topology is not ready after ${RHA_TIMEOUT}s (every process answering, the sentinels agreeing on a master and knowing each other and a replica); logs under $(rel "$RHA_DIR")/"
    fi
    sleep 0.2
  done
  rha_write_config "$m"
  rha_say redis-ha "ready in $(since "$t0"): master 127.0.0.1:$m, the three sentinels agree; settings in $(rel "$SVC_DIR/redis-ha.toml")"
  rha_status || true
}

rha_down() {
  local n
  # The sentinels first, so that stopping the master does not start a fail-over.
  for n in "${RHA_SENTINELS[@]}" "${RHA_SERVERS[@]}"; do rha_stop "$n"; done
}

# rha_status: one line per process with its role; non-zero if any is down.
rha_status() {
  local n p role line down=0 pid m
  for n in "${RHA_ALL[@]}"; do
    p=$(rha_port "$n")
    pid=$(rha_pid "$n") || pid=
    if ! rha_answers "$n"; then
      line="down"
      [[ -n $pid ]] && line+=" (pid $pid runs but does not answer)"
      down=1
    elif rha_is_sentinel "$n"; then
      m=$(rha_sentinel_says "$p")
      line="sentinel, master '$RHA_MASTER_NAME' at 127.0.0.1:$m, $(rha_sentinel_field "$p" num-other-sentinels) other sentinels, $(rha_sentinel_field "$p" num-slaves) replicas known"
      line+=", flags $(rha_sentinel_field "$p" flags)"
    else
      role=$(rha_info "$p" replication role)
      case $role in
        master) line="master, $(rha_info "$p" replication connected_slaves) replica(s) connected" ;;
        slave) line="replica of 127.0.0.1:$(rha_info "$p" replication master_port), link $(rha_info "$p" replication master_link_status)" ;;
        *) line="answers, role '$role'" ;;
      esac
    fi
    [[ -n $pid ]] && line+=" (pid $pid)"
    printf '%-9s %-3s 127.0.0.1:%-6s %s\n' "redis-ha:" "$n" "$p" "$line"
  done
  return "$down"
}

# rha_kill_master: SIGKILL to the master the sentinels name; prints its port.
rha_kill_master() {
  local s m n pid
  [[ -s $RHA_DIR/ports ]] || rha_die "no Redis HA topology under $(rel "$RHA_DIR"); run 'scripts/services up --redis-ha'"
  for s in "${RHA_SENTINELS[@]}"; do
    m=$(rha_sentinel_says "$(rha_port "$s")")
    [[ -n $m ]] && break
  done
  [[ -n $m ]] || rha_die "no sentinel answers; run 'scripts/services up --redis-ha'"
  n=$(rha_server_of "$m") || rha_die "the sentinels name 127.0.0.1:$m, not a server of this topology"
  pid=$(rha_pid "$n") || rha_die "the master the sentinels name, $n on port $m, is not running (a fail-over under way?)"
  [[ $(rha_info "$m" replication role) == master ]] ||
    rha_die "$n on port $m does not answer as a master (a fail-over under way?)"
  kill -KILL "$pid"
  wait_pid_gone "$pid" 10 || rha_die "$n (pid $pid) still runs after SIGKILL"
  printf 'redis-ha: killed the master %s (pid %s, port %s) with SIGKILL\n' "$n" "$pid" "$m" >&2
  echo "$m"
}

# rha_restart PORT: starts the stopped server on PORT as a replica of the master the
# sentinels agree on (after a fail-over, once they name another server).
rha_restart() {
  local port=$1 n m deadline waited=0 t0
  t0=$(now_us)
  [[ -s $RHA_DIR/ports ]] || rha_die "no Redis HA topology under $(rel "$RHA_DIR"); run 'scripts/services up --redis-ha'"
  n=$(rha_server_of "$port") ||
    rha_die "port '$port' is not a server of the topology (servers: $(rha_port r0) $(rha_port r1))"
  if rha_pid "$n" >/dev/null; then
    rha_answers "$n" || rha_die "$n runs but does not answer on port $port"
    rha_say "$n" "already running on port $port as $(rha_info "$port" replication role | sed 's/^slave$/a replica/; s/^master$/the master/'); nothing to do"
    return 0
  fi
  deadline=$((SECONDS + RHA_TIMEOUT))
  until m=$(rha_agreed_master) && [[ $m != "$port" && $(rha_info "$m" replication role) == master ]]; do
    ((SECONDS < deadline)) || rha_die "the sentinels do not agree on a master other than port $port that answers as one, after ${RHA_TIMEOUT}s"
    ((waited)) || rha_say "$n" "waiting for the sentinels to agree on a new master"
    waited=1
    sleep 0.2
  done
  rha_set_replicaof "$n" "$m"
  rha_start "$n"
  # Done when it is in sync and every sentinel sees it as a healthy replica: a
  # master killed before that could find no replica to promote (the sentinels then
  # wait 2 x failover-timeout before they try again).
  deadline=$((SECONDS + RHA_TIMEOUT))
  until [[ $(rha_info "$port" replication master_link_status) == up ]] && rha_sentinels_see_replica "$port" "$m"; do
    ((SECONDS < deadline)) || rha_die "$n started, but it is not in sync with the master 127.0.0.1:$m or not seen by every sentinel as its replica after ${RHA_TIMEOUT}s; see $(rel "$RHA_DIR/$n/redis.log")"
    sleep 0.2
  done
  rha_say "$n" "restarted on 127.0.0.1:$port as a replica of 127.0.0.1:$m, in sync, seen by the three sentinels ($(since "$t0"))"
}
