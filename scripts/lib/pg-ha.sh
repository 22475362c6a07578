# Sourced by scripts/services (up --ha, status, down) and scripts/failover: a local
# PostgreSQL high-availability topology (seed §14; docs/DESIGN.md, "PostgreSQL high
# availability"). Three servers named pg0, pg1 and pg2, each with its data under
# $HA_DIR/pgN: pg0 starts as the primary (initialised with data checksums, so that
# pg_rewind can rejoin a failed primary), pg1 and pg2 stream from it. Every server
# has the same configuration, whatever its role:
#   synchronous_standby_names = 'ANY 1 (pg0, pg1, pg2)', synchronous_commit = on
# so a commit waits until one standby has flushed it, and whichever server is
# promoted keeps that rule for the others. WAL is archived to $HA_DIR/archive.
# A server's name, port and socket are given on its command line (cluster_name is
# also the application_name its WAL receiver reports), never in its files: pg_rewind
# copies the configuration files from the server it rewinds against.
#
# The caller defines SVC_DIR and ROOT. SECKILL_HA_PORTS (default "55432 55433
# 55434") gives the three ports; they are recorded in $HA_DIR/ports at the first
# `up` and read from there afterwards. HA_SYNC=off (at the first `up`) leaves
# synchronous_standby_names empty: asynchronous standbys, for the measurement of
# what a fail-over loses without a synchronous one.

HA_DIR=${SVC_DIR:?}/ha
HA_NODES=(pg0 pg1 pg2)
HA_TIMEOUT=${SERVICES_START_TIMEOUT:-120}

ha_say() { printf '%-9s %s\n' "$1:" "$2"; }
ha_die() { printf 'pg-ha: error: %s\n' "$*" >&2; exit 1; }

ha_bindir() {
  local v
  v=$(ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n 1)
  [[ -n $v && -x /usr/lib/postgresql/$v/bin/postgres ]] || ha_die "no server binaries under /usr/lib/postgresql/*/bin"
  echo "/usr/lib/postgresql/$v/bin"
}

# initdb, postgres, pg_ctl and pg_rewind refuse to run as root.
ha_as() {
  if ((EUID == 0)); then
    (cd "$HA_DIR" && runuser -u postgres -- "$@")
  else
    (cd "$HA_DIR" && "$@")
  fi
}

ha_ports() {
  if [[ -s $HA_DIR/ports ]]; then
    cat "$HA_DIR/ports"
  else
    echo "${SECKILL_HA_PORTS:-55432 55433 55434}"
  fi
}

# ha_port pgN
ha_port() {
  local ports
  read -r -a ports <<<"$(ha_ports)"
  echo "${ports[${1#pg}]}"
}

# ha_sql PORT SQL: one value (or rows, '|'-separated), empty if the server does not answer.
ha_sql() {
  PGCONNECT_TIMEOUT=2 psql -X -A -t -q -h 127.0.0.1 -p "$1" -U postgres -d postgres \
    -c "$2" 2>/dev/null || true
}

# ha_role pgN: primary, standby or down.
ha_role() {
  case $(ha_sql "$(ha_port "$1")" 'SELECT pg_is_in_recovery()') in
    f) echo primary ;;
    t) echo standby ;;
    *) echo down ;;
  esac
}

ha_running() { [[ -f $HA_DIR/$1/data/postmaster.pid ]] && ha_as "$(ha_bindir)/pg_ctl" -D "$HA_DIR/$1/data" status >/dev/null 2>&1; }

# ha_start pgN: starts the server with its name, port and socket on the command line.
ha_start() {
  local n=$1 port out rc=0
  port=$(ha_port "$n")
  ha_as mkdir -p "$HA_DIR/$n/run"
  out=$(ha_as "$(ha_bindir)/pg_ctl" -D "$HA_DIR/$n/data" -l "$HA_DIR/$n/postgres.log" -w -t "$HA_TIMEOUT" \
    -o "-p $port -k '$HA_DIR/$n/run' -c cluster_name=$n" start 2>&1) || rc=$?
  if ((rc != 0)); then
    printf '%s\n' "$out" | sed 's/^/  | /' >&2
    tail -n 15 "$HA_DIR/$n/postgres.log" 2>/dev/null | sed 's/^/  | /' >&2
    ha_die "$n did not start; see $HA_DIR/$n/postgres.log"
  fi
}

# ha_stop pgN [MODE]: fast by default; immediate is a crash.
ha_stop() {
  ha_running "$1" || return 0
  ha_as "$(ha_bindir)/pg_ctl" -D "$HA_DIR/$1/data" -m "${2:-fast}" -w -t 60 stop >/dev/null
}

# ha_follow pgN PRIMARY: makes pgN (stopped) a standby of PRIMARY when it starts.
ha_follow() {
  local data=$HA_DIR/$1/data
  ha_as touch "$data/standby.signal"
  # Later lines win; ALTER SYSTEM would need the server running.
  ha_as sh -c "printf '%s\n' \"primary_conninfo = 'host=127.0.0.1 port=$(ha_port "$2") user=postgres'\" >>'$data/postgresql.auto.conf'"
}

ha_init_primary() {
  local data=$HA_DIR/pg0/data sync="'ANY 1 (pg0, pg1, pg2)'"
  [[ ${HA_SYNC:-on} == off ]] && sync="''"
  ha_say pg0 "initialising the primary in ${data#"$ROOT"/} (data checksums)"
  ha_as "$(ha_bindir)/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --no-locale \
    --data-checksums >"$HA_DIR/pg0/initdb.log" 2>&1 || ha_die "initdb failed; see $HA_DIR/pg0/initdb.log"
  ha_as sh -c "cat >>'$data/postgresql.conf'" <<EOF

# seckill-engine HA profile (scripts/lib/pg-ha.sh)
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 10
max_replication_slots = 10
hot_standby = on
hot_standby_feedback = on
wal_keep_size = 512MB
synchronous_standby_names = $sync
synchronous_commit = on
archive_mode = on
# A segment is archived at most a minute after it was begun, even when it is not
# full: without it an idle or slow primary keeps its last commits out of the
# archive indefinitely, and a restore after losing its disk would miss them (the
# restore drill reports that RPO). Each forced switch archives a whole 16 MB segment.
archive_timeout = 60s
archive_command = 'test ! -f $HA_DIR/archive/%f && cp %p $HA_DIR/archive/%f'
restore_command = 'cp $HA_DIR/archive/%f %p'
EOF
}

ha_clone() { # ha_clone pgN FROM
  local n=$1 data=$HA_DIR/$1/data
  ha_say "$n" "cloning ${data#"$ROOT"/} from $2 (pg_basebackup)"
  ha_as "$(ha_bindir)/pg_basebackup" -h 127.0.0.1 -p "$(ha_port "$2")" -U postgres -D "$data" \
    -X stream -c fast >"$HA_DIR/$n/basebackup.log" 2>&1 ||
    ha_die "pg_basebackup for $n failed; see $HA_DIR/$n/basebackup.log"
  ha_follow "$n" "$2"
}

# ha_primary: the name of the server that answers as primary (empty: none).
ha_primary() {
  local n
  for n in "${HA_NODES[@]}"; do
    [[ $(ha_role "$n") == primary ]] && { echo "$n"; return 0; }
  done
  return 0
}

ha_write_config() {
  local ports hosts=() p
  read -r -a ports <<<"$(ha_ports)"
  for p in "${ports[@]}"; do hosts+=("127.0.0.1:$p"); done
  local IFS=,
  cat >"$SVC_DIR/ha.toml" <<EOF
# Engine settings for the local HA topology (scripts/services up --ha); use with
# --config .services/ha.toml. The URL names every server; the engine writes to
# whichever is the primary.
[database]
url = "postgres://postgres@${hosts[*]}/seckill?target_session_attrs=read-write&sslmode=disable"
require_sync_standby = $([[ ${HA_SYNC:-on} == off ]] && echo false || echo true)
EOF
}

ha_up() {
  local n
  command -v psql >/dev/null || ha_die "psql is missing (Debian package postgresql-client)"
  mkdir -p "$HA_DIR/archive"
  if [[ ! -s $HA_DIR/ports ]]; then
    local ports
    ports=$(ha_ports)
    echo "$ports" >"$HA_DIR/ports"
  fi
  if ((EUID == 0)); then chown -R postgres:postgres "$HA_DIR"; fi
  if [[ ! -f $HA_DIR/pg0/data/PG_VERSION ]]; then
    ha_as mkdir -p "$HA_DIR/pg0"
    ha_init_primary
  fi
  # The primary first. After a fail-over two data directories may say "primary"
  # (the promoted one, and the old primary that has not rejoined): only the one on
  # the newest timeline may run as such; starting the other would be a split brain.
  local primary tli best=-1 candidate=
  primary=$(ha_primary)
  if [[ -z $primary ]]; then
    for n in "${HA_NODES[@]}"; do
      [[ -f $HA_DIR/$n/data/PG_VERSION && ! -f $HA_DIR/$n/data/standby.signal ]] || continue
      tli=$(ha_as "$(ha_bindir)/pg_controldata" -D "$HA_DIR/$n/data" |
        sed -n "s/^Latest checkpoint's TimeLineID: *//p")
      if [[ $tli =~ ^[0-9]+$ ]] && ((tli > best)); then best=$tli candidate=$n; fi
    done
    [[ -n $candidate ]] || ha_die "no server can start as primary; see 'scripts/failover' to promote one"
    ha_running "$candidate" || ha_start "$candidate"
    primary=$(ha_primary)
    [[ -n $primary ]] || ha_die "$candidate did not come up as primary; see $HA_DIR/$candidate/postgres.log"
  fi
  # Then the standbys; a new server is cloned from the primary.
  for n in "${HA_NODES[@]}"; do
    if [[ ! -f $HA_DIR/$n/data/PG_VERSION ]]; then
      ha_as mkdir -p "$HA_DIR/$n"
      ha_clone "$n" "$primary"
    elif [[ ! -f $HA_DIR/$n/data/standby.signal ]]; then
      [[ $n == "$primary" ]] ||
        ha_say "$n" "left stopped: it was a primary before a fail-over ('scripts/failover rejoin' makes it a standby)"
      continue
    fi
    ha_running "$n" || ha_start "$n"
  done
  ha_write_config
  ha_say ha "primary $primary; engine settings in ${SVC_DIR#"$ROOT"/}/ha.toml"
  ha_status || true
}

ha_down() {
  local n
  for n in "${HA_NODES[@]}"; do
    if ha_running "$n"; then
      ha_stop "$n" fast && ha_say "$n" "stopped"
    fi
  done
}

# ha_status: roles, sync state and lag, one line per server.
ha_status() {
  local n role port down=0 primary line
  primary=$(ha_primary)
  for n in "${HA_NODES[@]}"; do
    port=$(ha_port "$n")
    role=$(ha_role "$n")
    [[ $role == down ]] && down=1
    line="$role"
    if [[ $role == standby && -n $primary ]]; then
      line+=$(ha_sql "$(ha_port "$primary")" "SELECT ', ' || sync_state || ', ' ||
        coalesce(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn), 0)::bigint || ' bytes behind, replay lag ' ||
        coalesce(extract(epoch FROM replay_lag)::numeric(10,3), 0) || ' s'
        FROM pg_stat_replication WHERE application_name = '$n'")
      [[ $line == standby ]] && line+=", not streaming from $primary"
    elif [[ $role == primary ]]; then
      line+=", synchronous_standby_names = '$(ha_sql "$port" 'SHOW synchronous_standby_names')'"
    fi
    printf '%-9s 127.0.0.1:%-6s %s\n' "$n:" "$port" "$line"
  done
  return "$down"
}
