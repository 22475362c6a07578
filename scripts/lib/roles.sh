# Sourced by scripts/services (up --roles): one identity per job (docs/OPERATIONS.md,
# "Roles") on the configured services, and the engine's settings for them in
# $SVC_DIR/roles.toml. Idempotent; passwords are generated once into
# $SVC_DIR/roles/secrets (mode 600) and kept.
#   PostgreSQL  scripts/lib/roles.sql, under the role prefix (the database's name,
#               lower case, other characters as _; written to roles.toml as
#               database.role_prefix): <p>_owner (migrate, maintain), <p>_engine
#               (serve: <p>_runtime + pg_monitor), <p>_history (<p>_readonly); the
#               database is created owned by <p>_owner when missing. A database of
#               that name owned by another role (a plain `migrate` made it, as
#               postgres) is left alone: the roles get a database of their own,
#               <name>_roles, and say so (taking another role's data over is a
#               decision for its owner, not for this script)
#   RabbitMQ    seckill-engine     configure/write/read on the namespace's names
#               seckill-frontstage write on <ns>.orders only
#               seckill-payments   write on <ns>.payments only
#               none of them may write on the default exchange, which routes to
#               any queue by name; order messages are signed (amqp.order_signing_secret)
#   Redis       ACL user seckill-engine: the commands the engine sends, on keys
#               under the prefix
# The caller defines SVC_DIR, ROOT and the loaded configuration (HOST, PORT,
# PG_*, AMQP_*, REDIS_*) and helpers of scripts/services. SECKILL_ROLES_USER_PREFIX
# (default seckill) names the broker and Redis users; the namespace and key prefix
# are SECKILL__AMQP__NAMESPACE and SECKILL__REDIS__KEY_PREFIX (default seckill).

ROLES_DIR=${SVC_DIR:?}/roles
# The prefix of the broker and Redis user names (the tests use their own).
ROLES_USER=${SECKILL_ROLES_USER_PREFIX:-seckill}
# The Redis commands of src/redis (and of its Lua scripts), and what the client
# sends on connecting (CLIENT SETINFO, Redis 7.2 and later, is refused and the
# client goes on without it).
REDIS_ACL_COMMANDS="+get +set +del +incr +decr +exists +pexpireat +zadd +zcard +zscore +zrange +zrangebyscore +zrem
  +hget +hset +hsetnx +hdel +evalsha +eval +script|load +script|exists +multi +exec +discard +ping
  +client|setname +client|id +hello +select"

roles_say() { printf '%-9s %s\n' "$1:" "$2"; }

roles_rabbitmqctl() {
  if [[ $(origin rabbitmq) == project-local ]]; then
    rmqctl "$@"
  elif is_local_host "${HOST[rabbitmq]}" && command -v rabbitmqctl >/dev/null; then
    rabbitmqctl "$@"
  else
    return 1
  fi
}

roles_up() {
  local ns prefix db owner owner_role rp pw_engine pw_front pw_pay pw_redis re
  ns=${SECKILL__AMQP__NAMESPACE:-seckill}
  prefix=${SECKILL__REDIS__KEY_PREFIX:-seckill}
  mkdir -p "$ROLES_DIR"
  chmod 700 "$ROLES_DIR"
  if [[ ! -s $ROLES_DIR/secrets ]]; then
    (
      umask 077
      printf 'PW_ENGINE=%s\nPW_FRONT=%s\nPW_PAY=%s\nPW_REDIS=%s\n' "$(openssl rand -hex 16)" \
        "$(openssl rand -hex 16)" "$(openssl rand -hex 16)" "$(openssl rand -hex 16)" >"$ROLES_DIR/secrets"
    )
  fi
  # Added after the first release: a secrets file written before it gains the key.
  if ! grep -q '^ORDER_SIGNING=' "$ROLES_DIR/secrets"; then
    printf 'ORDER_SIGNING=%s\n' "$(openssl rand -hex 32)" >>"$ROLES_DIR/secrets"
  fi
  # shellcheck disable=SC1091
  . "$ROLES_DIR/secrets"
  pw_engine=$PW_ENGINE pw_front=$PW_FRONT pw_pay=$PW_PAY pw_redis=$PW_REDIS

  local psql=(psql -X -q -A -t -v ON_ERROR_STOP=1 -h "${HOST[postgres]}" -p "${PORT[postgres]}" -U "$PG_USER" -d postgres)
  # The engine's default (domain::roles::role_prefix_for), written down in
  # roles.toml so the engine uses exactly the roles made here.
  prefix_of() {
    local p
    p=$(printf '%s' "${1,,}" | LC_ALL=C sed 's/[^a-z0-9_]/_/g')
    [[ $p =~ ^[a-z] ]] || p=d$p
    printf '%s' "${p:0:40}"
  }
  owner_of() {
    echo "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = :'db'" |
      PGPASSWORD=$PG_PASS "${psql[@]}" -v db="$1"
  }
  db=$PG_DB
  rp=$(prefix_of "$db")
  owner=$(owner_of "$db")
  if [[ -n $owner && $owner != "${rp}_owner" ]]; then
    roles_say postgres "database $db is owned by $owner (made without --roles); the roles get a database, an AMQP namespace and a Redis prefix of their own: ${db}_roles, ${ns}_roles, ${prefix}_roles"
    db=${db}_roles ns=${ns}_roles prefix=${prefix}_roles
    rp=$(prefix_of "$db")
    owner=$(owner_of "$db")
    [[ -z $owner || $owner == "${rp}_owner" ]] ||
      die "database $db exists too and is owned by $owner, not ${rp}_owner: drop it (or give it to ${rp}_owner) and run 'up --roles' again"
  fi
  PGPASSWORD=$PG_PASS PGOPTIONS="-c client_min_messages=warning -c seckill.role_prefix=$rp" "${psql[@]}" \
    -f "$ROOT/scripts/lib/roles.sql" >/dev/null ||
    die "creating the PostgreSQL roles failed (the configured user must be a superuser)"
  owner_role=${rp}_owner
  if [[ -z $owner ]]; then
    echo 'CREATE DATABASE :"db" OWNER :"owner"' | PGPASSWORD=$PG_PASS "${psql[@]}" -v db="$db" -v owner="$owner_role" ||
      die "creating database $db failed"
    roles_say postgres "database $db created, owned by $owner_role"
  fi
  roles_say postgres "roles ${rp}_owner, ${rp}_engine (${rp}_runtime, pg_monitor), ${rp}_history (${rp}_readonly)"

  re=${ns//./\\.}
  if roles_rabbitmqctl -q status >/dev/null 2>&1; then
    local user pw conf write read
    while read -r user pw conf write read; do
      # </dev/null: rabbitmqctl would read the rest of the list.
      roles_rabbitmqctl -q add_user "$user" "$pw" </dev/null >/dev/null 2>&1 ||
        roles_rabbitmqctl -q change_password "$user" "$pw" </dev/null >/dev/null ||
        die "rabbitmqctl: cannot create user $user"
      roles_rabbitmqctl -q set_permissions -p "$AMQP_VHOST" "$user" "$conf" "$write" "$read" </dev/null >/dev/null ||
        die "rabbitmqctl: cannot set the permissions of $user"
    done <<EOF
$ROLES_USER-engine $pw_engine ^$re\\. ^$re\\. ^$re\\.
$ROLES_USER-frontstage $pw_front ^\$ ^$re\\.orders\$ ^\$
$ROLES_USER-payments $pw_pay ^\$ ^$re\\.payments\$ ^\$
EOF
    roles_say rabbitmq "users $ROLES_USER-engine, $ROLES_USER-frontstage, $ROLES_USER-payments on vhost $AMQP_VHOST"
  else
    warn rabbitmq "rabbitmqctl cannot reach the broker; create the users by hand (docs/OPERATIONS.md, \"Roles\")"
  fi

  local rcli=(redis-cli -h "${HOST[redis]}" -p "${PORT[redis]}")
  [[ -z $REDIS_PASS ]] || rcli+=(--user "${REDIS_USER:-default}" --pass "$REDIS_PASS" --no-auth-warning)
  # shellcheck disable=SC2086
  [[ $("${rcli[@]}" ACL SETUSER "$ROLES_USER-engine" reset on ">$pw_redis" "~$prefix:*" resetchannels -@all $REDIS_ACL_COMMANDS) == OK ]] ||
    die "redis: ACL SETUSER $ROLES_USER-engine failed"
  roles_say redis "ACL user $ROLES_USER-engine on keys $prefix:* (not persisted: a restarted server needs 'up --roles' again)"

  local pg="${HOST[postgres]}:${PORT[postgres]}" amqp="${HOST[rabbitmq]}:${PORT[rabbitmq]}"
  local vhost
  vhost=$("$PY" -c 'import sys, urllib.parse as u; print(u.quote(sys.argv[1], safe=""))' "$AMQP_VHOST")
  (
    umask 077
    cat >"$SVC_DIR/roles.toml" <<EOF
# Engine settings with one identity per job (scripts/services up --roles); use with
# --config. Holds passwords: keep it private.
[database]
url = "postgres://${rp}_engine@$pg/$db?sslmode=disable"
owner_url = "postgres://${rp}_owner@$pg/$db?sslmode=disable"
role_prefix = "$rp"

[amqp]
url = "amqp://$ROLES_USER-engine:$pw_engine@$amqp/$vhost"
namespace = "$ns"
order_signing_secret = "$ORDER_SIGNING"

[frontstage]
amqp_url = "amqp://$ROLES_USER-frontstage:$pw_front@$amqp/$vhost"

[redis]
url = "redis://$ROLES_USER-engine:$pw_redis@${HOST[redis]}:${PORT[redis]}"
key_prefix = "$prefix"
EOF
  )
  roles_say roles "engine settings in ${SVC_DIR#"$ROOT"/}/roles.toml (payment providers: amqp://$ROLES_USER-payments:…, in ${ROLES_DIR#"$ROOT"/}/secrets)"
}
