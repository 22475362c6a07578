# Sourced by scripts/services (up --tls, down, status, tls-rabbitmqctl): the TLS
# profile. A throwaway certificate authority generated with openssl, and the three
# services with TLS listeners only, on their own ports, data under $TLS_DIR:
#   PostgreSQL  ssl = on; pg_hba accepts hostssl and rejects hostnossl
#   RabbitMQ    an amqps listener and no plaintext one (node seckill-tls-PORT)
#   Redis       a TLS port, the plaintext port off (port 0), client certificates required
# The server certificate names localhost and 127.0.0.1. A second authority
# (other-ca.crt) signed nothing the servers hold: configured as the CA, the
# engine must refuse them. Writes the engine settings to $SVC_DIR/tls.toml.
#
# The caller defines SVC_DIR, ROOT, PY and the helpers of scripts/services.
# SECKILL_TLS_PORTS (default "55440 55671 55679": PostgreSQL, AMQPS, Redis) gives
# the ports; they are recorded in $TLS_DIR/ports at the first `up`.

TLS_DIR=${SVC_DIR:?}/tls
TLS_PKI=$TLS_DIR/pki
TLS_TIMEOUT=${SERVICES_START_TIMEOUT:-120}

tls_say() { printf '%-9s %s\n' "$1:" "$2"; }
tls_die() { printf 'tls: error: %s\n' "$*" >&2; exit 1; }

tls_ports() {
  if [[ -s $TLS_DIR/ports ]]; then cat "$TLS_DIR/ports"; else echo "${SECKILL_TLS_PORTS:-55440 55671 55679}"; fi
}
tls_port() { # tls_port postgres|amqps|redis
  local ports
  read -r -a ports <<<"$(tls_ports)"
  case $1 in postgres) echo "${ports[0]}" ;; amqps) echo "${ports[1]}" ;; redis) echo "${ports[2]}" ;; esac
}

# tls_pki: the authorities, the server's certificate and a client certificate
# (CN seckill-engine), EC P-256, valid 30 days; made once.
tls_pki() {
  [[ -s $TLS_PKI/client.crt ]] && return 0
  command -v openssl >/dev/null || tls_die "openssl is missing (Debian package openssl)"
  mkdir -p "$TLS_PKI"
  (
    cd "$TLS_PKI"
    umask 077
    local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -days 30 -subj "/CN=seckill test CA" -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -x509 "${ec[@]}" -days 30 -subj "/CN=seckill other CA" -keyout other-ca.key -out other-ca.crt 2>/dev/null
    sign() { # sign NAME CN EXTENSIONS
      openssl req -new "${ec[@]}" -subj "/CN=$2" -keyout "$1.key" -out "$1.csr" 2>/dev/null
      printf '%s\n' "basicConstraints=CA:FALSE" "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    sign server localhost $'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth'
    sign client seckill-engine "extendedKeyUsage=clientAuth"
    chmod 644 ./*.crt
  ) || tls_die "openssl could not make the certificates under $TLS_PKI"
  tls_say pki "a throwaway CA and certificates in ${TLS_PKI#"$ROOT"/}"
}

# ---- PostgreSQL
tls_pg_as() {
  if ((EUID == 0)); then (cd "$TLS_DIR" && runuser -u postgres -- "$@"); else (cd "$TLS_DIR" && "$@"); fi
}
tls_pg_running() {
  [[ -f $TLS_DIR/postgres/data/postmaster.pid ]] &&
    tls_pg_as "$(pg_bindir)/pg_ctl" -D "$TLS_DIR/postgres/data" status >/dev/null 2>&1
}
tls_pg_up() {
  local dir=$TLS_DIR/postgres port out rc=0
  port=$(tls_port postgres)
  if ((EUID == 0)); then chown postgres:postgres "$TLS_DIR"; fi
  tls_pg_as mkdir -p "$dir/run"
  if [[ ! -f $dir/data/PG_VERSION ]]; then
    tls_pg_as "$(pg_bindir)/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale \
      >"$TLS_DIR/initdb.log" 2>&1 || tls_die "initdb failed; see $TLS_DIR/initdb.log"
    # The server reads its key only if no one else can.
    cp "$TLS_PKI/server.crt" "$TLS_PKI/ca.crt" "$TLS_PKI/server.key" "$dir/data/"
    chmod 600 "$dir/data/server.key"
    if ((EUID == 0)); then chown postgres:postgres "$dir/data/server.crt" "$dir/data/ca.crt" "$dir/data/server.key"; fi
    tls_pg_as sh -c "cat >>'$dir/data/postgresql.conf'" <<EOF

# seckill-engine TLS profile (scripts/lib/tls.sh)
listen_addresses = '127.0.0.1'
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_ca_file = 'ca.crt'
EOF
    tls_pg_as sh -c "cat >'$dir/data/pg_hba.conf'" <<EOF
# seckill-engine TLS profile: TLS or nothing over TCP.
local     all all              trust
hostssl   all all 127.0.0.1/32 trust
hostnossl all all 0.0.0.0/0    reject
EOF
  fi
  tls_pg_running && return 0
  out=$(tls_pg_as "$(pg_bindir)/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t "$TLS_TIMEOUT" \
    -o "-p $port -k '$dir/run'" start 2>&1) || rc=$?
  ((rc == 0)) || { printf '%s\n' "$out" >&2; tail -n 15 "$dir/postgres.log" >&2; tls_die "PostgreSQL (TLS) did not start"; }
  tls_say postgres "TLS only on 127.0.0.1:$port (data ${dir#"$ROOT"/})"
}
tls_pg_down() {
  tls_pg_running || return 0
  tls_pg_as "$(pg_bindir)/pg_ctl" -D "$TLS_DIR/postgres/data" -m fast -w -t 60 stop >/dev/null
  tls_say postgres "stopped the TLS server"
}

# ---- RabbitMQ
tls_rmq_env() {
  local dir=$TLS_DIR/rabbitmq
  export HOME=$dir/home
  export RABBITMQ_NODENAME=$(<"$dir/node") RABBITMQ_DIST_PORT=$(<"$dir/dist")
  export RABBITMQ_MNESIA_BASE=$dir/mnesia RABBITMQ_LOG_BASE=$dir/log
  export RABBITMQ_PID_FILE=$dir/rabbitmq.pid RABBITMQ_CONFIG_FILE=$dir/rabbitmq.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$dir/advanced.config
  export RABBITMQ_ENABLED_PLUGINS_FILE=$dir/enabled_plugins RABBITMQ_CONF_ENV_FILE=$dir/rabbitmq-env.conf
  export ERL_EPMD_ADDRESS=127.0.0.1
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  unset RABBITMQ_NODE_PORT RABBITMQ_NODE_IP_ADDRESS RABBITMQ_ENABLED_PLUGINS ERL_FLAGS
}
tls_rmqctl() { # tls_rmqctl ARGS...: rabbitmqctl against the TLS node
  [[ -s $TLS_DIR/rabbitmq/node ]] || return 1
  (tls_rmq_env && cd "$TLS_DIR/rabbitmq" && exec "$RMQ_BIN/rabbitmqctl" -n "$RABBITMQ_NODENAME" "$@")
}
tls_rmq_up() {
  local dir=$TLS_DIR/rabbitmq port wpid deadline
  port=$(tls_port amqps)
  if tls_rmqctl -q status >/dev/null 2>&1; then return 0; fi
  mkdir -p "$dir/home" "$dir/mnesia" "$dir/log"
  chmod 700 "$dir/home"
  echo "seckill-tls-$port@localhost" >"$dir/node"
  free_port >"$dir/dist"
  printf '[].\n' >"$dir/enabled_plugins"
  : >"$dir/rabbitmq-env.conf"
  cat >"$dir/rabbitmq.conf" <<EOF
# generated by scripts/lib/tls.sh: amqps only
log.console = false
listeners.tcp = none
listeners.ssl.default = 127.0.0.1:$port
ssl_options.cacertfile = $TLS_PKI/ca.crt
ssl_options.certfile = $TLS_PKI/server.crt
ssl_options.keyfile = $TLS_PKI/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
EOF
  (tls_rmq_env && cd "$dir" && exec setsid -w "$RMQ_BIN/rabbitmq-server") >"$dir/log/startup.log" 2>&1 </dev/null &
  wpid=$!
  deadline=$((SECONDS + TLS_TIMEOUT))
  until tls_rmqctl -q await_startup --timeout 5 >/dev/null 2>&1; do
    pid_alive "$wpid" || { tail -n 20 "$dir/log/startup.log" >&2; tls_die "RabbitMQ (TLS) exited during startup"; }
    ((SECONDS < deadline)) || { kill "$wpid" 2>/dev/null; tls_die "RabbitMQ (TLS) did not start within ${TLS_TIMEOUT}s"; }
    sleep 1
  done
  tls_say rabbitmq "amqps only on 127.0.0.1:$port (node $(<"$dir/node"))"
}
tls_rmq_down() {
  local pid
  [[ -s $TLS_DIR/rabbitmq/node ]] || return 0
  pid=$(cat "$TLS_DIR/rabbitmq/rabbitmq.pid" 2>/dev/null || true)
  tls_rmqctl -q stop >/dev/null 2>&1 || { [[ -n $pid ]] && kill "$pid" 2>/dev/null; } || true
  [[ -z $pid ]] || wait_pid_gone "$pid" 60 || true
  tls_say rabbitmq "stopped the TLS node"
}

# ---- Redis
tls_redis_up() {
  local dir=$TLS_DIR/redis port
  port=$(tls_port redis)
  mkdir -p "$dir"
  [[ -f $dir/redis.pid ]] && pid_alive "$(cat "$dir/redis.pid")" && return 0
  cat >"$dir/redis.conf" <<EOF
# generated by scripts/lib/tls.sh: TLS only, client certificates required
bind 127.0.0.1
port 0
tls-port $port
tls-cert-file $TLS_PKI/server.crt
tls-key-file $TLS_PKI/server.key
tls-ca-cert-file $TLS_PKI/ca.crt
tls-auth-clients yes
daemonize yes
save ""
appendonly no
dir $dir
logfile $dir/redis.log
pidfile $dir/redis.pid
EOF
  redis-server "$dir/redis.conf" >>"$dir/redis.log" 2>&1 </dev/null || { tail -n 15 "$dir/redis.log" >&2; tls_die "redis-server (TLS) failed to start"; }
  local deadline=$((SECONDS + TLS_TIMEOUT))
  until redis-cli --tls --cacert "$TLS_PKI/ca.crt" --cert "$TLS_PKI/client.crt" --key "$TLS_PKI/client.key" \
    -h 127.0.0.1 -p "$port" PING 2>/dev/null | grep -q PONG; do
    ((SECONDS < deadline)) || { tail -n 15 "$dir/redis.log" >&2; tls_die "Redis (TLS) did not answer within ${TLS_TIMEOUT}s"; }
    sleep 0.2
  done
  tls_say redis "TLS only on 127.0.0.1:$port, client certificates required"
}
tls_redis_down() {
  local pid
  pid=$(cat "$TLS_DIR/redis/redis.pid" 2>/dev/null) || return 0
  pid_alive "$pid" || return 0
  kill "$pid" && wait_pid_gone "$pid" 30 || true
  tls_say redis "stopped the TLS server"
}

tls_write_config() {
  cat >"$SVC_DIR/tls.toml" <<EOF
# Engine settings for the TLS profile (scripts/services up --tls); use with
# --config. Every link verified against the profile's throwaway CA.
[database]
url = "postgres://postgres@127.0.0.1:$(tls_port postgres)/seckill?sslmode=verify-full"
[database.tls]
ca_file = "$TLS_PKI/ca.crt"

[amqp]
url = "amqps://guest:guest@127.0.0.1:$(tls_port amqps)/%2f"
[amqp.tls]
ca_file = "$TLS_PKI/ca.crt"

[redis]
url = "rediss://127.0.0.1:$(tls_port redis)"
[redis.tls]
ca_file = "$TLS_PKI/ca.crt"
cert_file = "$TLS_PKI/client.crt"
key_file = "$TLS_PKI/client.key"
EOF
}

tls_up() {
  mkdir -p "$TLS_DIR"
  [[ -s $TLS_DIR/ports ]] || tls_ports >"$TLS_DIR/ports.new"
  [[ -s $TLS_DIR/ports ]] || mv "$TLS_DIR/ports.new" "$TLS_DIR/ports"
  tls_pki
  tls_pg_up
  tls_redis_up
  tls_rmq_up
  tls_write_config
  tls_say tls "engine settings in ${SVC_DIR#"$ROOT"/}/tls.toml"
}

tls_down() {
  tls_rmq_down
  tls_redis_down
  tls_pg_down
}

tls_status() {
  local down=0
  if tls_pg_running; then tls_say postgres "TLS 127.0.0.1:$(tls_port postgres) answering"; else tls_say postgres "TLS server down"; down=1; fi
  if tls_rmqctl -q status >/dev/null 2>&1; then tls_say rabbitmq "amqps 127.0.0.1:$(tls_port amqps) answering"; else tls_say rabbitmq "TLS node down"; down=1; fi
  if [[ -f $TLS_DIR/redis/redis.pid ]] && pid_alive "$(cat "$TLS_DIR/redis/redis.pid")"; then
    tls_say redis "TLS 127.0.0.1:$(tls_port redis) answering"
  else
    tls_say redis "TLS server down"; down=1
  fi
  return "$down"
}
