#!/usr/bin/env bash
# Throwaway PostgreSQL, Redis and Redis Cluster (3 masters) servers for the store tests.
#
#   bash .ci/services.sh start   # install if missing, start, wait, print the env
#   bash .ci/services.sh stop    # shut both down and delete their data
#   bash .ci/services.sh env     # print the env lines of the running servers
#
# `start` prints only `export NAME=value` lines on stdout (progress goes to stderr), so
#   eval "$(bash .ci/services.sh start)"
# works; it also writes them to "$SCOPE_SERVICES_DIR/env.sh" for `source`.
# Both commands are idempotent. Servers listen on 127.0.0.1 only, on non-default ports
# (override with SCOPE_PG_PORT / SCOPE_REDIS_PORT), with data under SCOPE_SERVICES_DIR
# (default: ${TMPDIR:-/tmp}/scope-services). PostgreSQL refuses to run as root: as root
# the cluster is owned by the `postgres` user (created when missing).
set -euo pipefail

PG_PORT="${SCOPE_PG_PORT:-25432}"  # below the ephemeral range, like the cluster's
REDIS_PORT="${SCOPE_REDIS_PORT:-63799}"
# The cluster's three masters listen on this port and the next two, and each also on its
# port + 10000 (the cluster bus). All six stay below Linux's ephemeral range (32768 and
# up), where an outgoing connection of an earlier test run may still hold the port.
CLUSTER_PORT="${SCOPE_REDIS_CLUSTER_PORT:-17381}"
STATE="${SCOPE_SERVICES_DIR:-${TMPDIR:-/tmp}/scope-services}"
PGDATA_DIR="$STATE/pgdata"
PGSOCK_DIR="$STATE/pgsock"
REDIS_DIR="$STATE/redis"
ENV_FILE="$STATE/env.sh"
# The loopback server has no TLS, so the DSN says so: with asyncpg's default
# (sslmode=prefer) every new connection, cancel requests included, first asks for TLS,
# and a cancel request torn down mid-connect leaves an unretrieved future whose
# "unexpected connection_lost() call" the test runner reports in whatever test runs next.
PG_DSN="postgresql://scope@127.0.0.1:${PG_PORT}/postgres?sslmode=disable"
REDIS_URL="redis://127.0.0.1:${REDIS_PORT}/0"
CLUSTER_URL="redis://127.0.0.1:${CLUSTER_PORT}/0"
CLUSTER_DIR="$STATE/redis-cluster"

log() { echo "services: $*" >&2; }

apt_updated=0
apt_install() {
    if ! command -v apt-get >/dev/null 2>&1; then
        log "apt-get is not available: install $* yourself"
        exit 1
    fi
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        apt_updated=1
    fi
    # policy-rc.d exit 101 keeps the packages' own services from starting.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ] && [ "$(id -u)" = 0 ]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
    if [ "$created_policy" = 1 ]; then rm -f "$policy"; fi
}

pg_bindir() {
    local dir
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir 2>/dev/null || true)"
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then echo "$dir"; return 0; fi
    fi
    # Debian keeps the server binaries off PATH; take the newest version installed.
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then echo "$dir"; return 0; fi
    if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
        dirname "$(readlink -f "$(command -v initdb)")"
        return 0
    fi
    return 1
}

# Run a PostgreSQL server command as the cluster owner.
as_pg() {
    if [ "$(id -u)" = 0 ]; then
        if command -v runuser >/dev/null 2>&1; then
            runuser -u postgres -- "$@"
        else
            su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
        fi
    else
        "$@"
    fi
}

write_env() {
    mkdir -p "$STATE"
    {
        echo "export SCOPE_TEST_POSTGRES_DSN='$PG_DSN'"
        echo "export SCOPE_TEST_REDIS_URL='$REDIS_URL'"
        echo "export SCOPE_TEST_REDIS_CLUSTER_URL='$CLUSTER_URL'"
    } >"$ENV_FILE"
    cat "$ENV_FILE"
}

start_postgres() {
    local bindir
    if ! bindir="$(pg_bindir)"; then
        log "installing postgresql"
        apt_install postgresql
        bindir="$(pg_bindir)" || { log "PostgreSQL binaries not found after install"; exit 1; }
    fi
    if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
        log "creating the postgres user"
        useradd --system --home-dir /var/lib/postgresql --shell /bin/sh postgres
    fi
    mkdir -p "$STATE"
    chmod 755 "$STATE"
    if [ ! -s "$PGDATA_DIR/PG_VERSION" ]; then
        log "initdb in $PGDATA_DIR"
        rm -rf "$PGDATA_DIR"
        mkdir -p "$PGDATA_DIR"
        if [ "$(id -u)" = 0 ]; then chown postgres: "$PGDATA_DIR"; fi
        chmod 700 "$PGDATA_DIR"
        as_pg "$bindir/initdb" -D "$PGDATA_DIR" -U scope --auth=trust -E UTF8 --locale=C \
            >"$STATE/initdb.log" 2>&1 || { cat "$STATE/initdb.log" >&2; exit 1; }
    fi
    mkdir -p "$PGSOCK_DIR"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$PGSOCK_DIR"; fi
    if as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" status >/dev/null 2>&1; then
        log "postgres already running"
    else
        log "starting postgres on 127.0.0.1:$PG_PORT"
        touch "$STATE/postgres.log"
        if [ "$(id -u)" = 0 ]; then chown postgres: "$STATE/postgres.log"; fi
        as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" -l "$STATE/postgres.log" -w -t 60 \
            -o "-p $PG_PORT -k $PGSOCK_DIR -c listen_addresses=127.0.0.1 -c max_connections=300" \
            start >&2 || { tail -n 30 "$STATE/postgres.log" >&2; exit 1; }
    fi
    local i
    for i in $(seq 1 120); do
        if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; then return 0; fi
        sleep 0.5
    done
    log "postgres did not accept connections"
    tail -n 30 "$STATE/postgres.log" >&2
    exit 1
}

stop_postgres() {
    local bindir
    bindir="$(pg_bindir)" || return 0
    if [ -s "$PGDATA_DIR/PG_VERSION" ] && as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" status \
        >/dev/null 2>&1; then
        log "stopping postgres"
        as_pg "$bindir/pg_ctl" -D "$PGDATA_DIR" -m fast -w stop >&2 || true
    fi
}

redis_ping() {
    [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null || true)" = "PONG" ]
}

start_redis() {
    if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
        log "installing redis-server"
        apt_install redis-server redis-tools
    fi
    if redis_ping; then
        log "redis already running"
        return 0
    fi
    mkdir -p "$REDIS_DIR"
    log "starting redis on 127.0.0.1:$REDIS_PORT"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes \
        --dir "$REDIS_DIR" --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log" \
        --save "" --appendonly no --protected-mode yes >&2
    local i
    for i in $(seq 1 120); do
        if redis_ping; then return 0; fi
        sleep 0.25
    done
    log "redis did not answer PING"
    tail -n 30 "$REDIS_DIR/redis.log" >&2 || true
    exit 1
}

stop_redis() {
    if command -v redis-cli >/dev/null 2>&1 && redis_ping; then
        log "stopping redis"
        redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
        local i
        for i in $(seq 1 40); do
            redis_ping || return 0
            sleep 0.25
        done
        log "redis did not stop"
        return 1
    fi
}

cluster_ports() { echo "$CLUSTER_PORT" $((CLUSTER_PORT + 1)) $((CLUSTER_PORT + 2)); }

cluster_ok() {
    [ "$(redis-cli -h 127.0.0.1 -p "$CLUSTER_PORT" cluster info 2>/dev/null \
        | tr -d '\r' | grep '^cluster_state:' || true)" = "cluster_state:ok" ]
}

start_redis_cluster() {
    if cluster_ok; then
        log "redis cluster already running"
        return 0
    fi
    local port nodes=()
    for port in $(cluster_ports); do
        mkdir -p "$CLUSTER_DIR/$port"
        if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)" != "PONG" ]; then
            redis-server --bind 127.0.0.1 --port "$port" --daemonize yes \
                --dir "$CLUSTER_DIR/$port" --pidfile "$CLUSTER_DIR/$port/redis.pid" \
                --logfile "$CLUSTER_DIR/$port/redis.log" --cluster-enabled yes \
                --cluster-config-file "$CLUSTER_DIR/$port/nodes.conf" \
                --cluster-node-timeout 5000 --save "" --appendonly no --protected-mode yes >&2
        fi
        nodes+=("127.0.0.1:$port")
    done
    local i up
    for port in $(cluster_ports); do
        up=0
        for i in $(seq 1 120); do
            if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null || true)" = "PONG" ]; then
                up=1
                break
            fi
            sleep 0.25
        done
        if [ "$up" = 0 ]; then
            log "redis cluster node on port $port did not answer PING"
            tail -n 20 "$CLUSTER_DIR/$port/redis.log" >&2 || true
            exit 1
        fi
    done
    log "creating the redis cluster on ${nodes[*]}"
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >&2
    for i in $(seq 1 120); do
        if cluster_ok; then return 0; fi
        sleep 0.25
    done
    log "redis cluster did not reach cluster_state:ok"
    exit 1
}

stop_redis_cluster() {
    local port
    command -v redis-cli >/dev/null 2>&1 || return 0
    for port in $(cluster_ports); do
        redis-cli -h 127.0.0.1 -p "$port" shutdown nosave >/dev/null 2>&1 || true
    done
}

case "${1:-}" in
    start)
        start_postgres
        start_redis
        start_redis_cluster
        write_env
        ;;
    stop)
        stop_postgres
        stop_redis
        stop_redis_cluster
        rm -rf "$STATE"
        ;;
    env)
        if [ -f "$ENV_FILE" ]; then cat "$ENV_FILE"; else log "not started"; exit 1; fi
        ;;
    *)
        echo "usage: bash .ci/services.sh start|stop|env" >&2
        exit 2
        ;;
esac
