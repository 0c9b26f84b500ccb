# Shared by the experiments that run the release API pinned at the production shape
# (stream-outbox/pinned.sh, stream-heartbeats/pinned.sh, stream-storm/pinned.sh), sourced first,
# with the script's arguments: strict mode, the experiment's directory (HERE, the working
# directory) and ROUNDS (its first argument, 3 by default), the production tier's settings, the
# binaries' check, a variant built from a patch, the streams' data set, and a pinned API started,
# awaited and stopped (on DB and PORT, which the experiment sets).
#
# env: PGURL (the server)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE"
ROUNDS=${1:-3}
ROOT=$(git rev-parse --show-toplevel)
BIN=$ROOT/target/release
PGURL=${PGURL:-postgres://postgres@127.0.0.1:5432}
WORK=$(mktemp -d)
API=
# Set by an experiment to stop what else it runs beside the API (a load in the background).
cleanup_more() { :; }
cleanup() {
  cleanup_more
  if [ -n "$API" ]; then kill -TERM "$API" 2>/dev/null || true; wait "$API" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# The production tier's settings, from their one owner (the lab), as `NAME=value` words.
TIER=$(sed -n 's/^pub(super) const PRODUCTION_TIER.*= \[\(.*\)\];$/\1/p' "$ROOT/crates/lab/src/lab/phase.rs" |
  sed -e 's/("\([A-Z_]*\)", "\([^"]*\)")/\1=\2/g' -e 's/,//g')
[[ $TIER == *TOKIO_WORKER_THREADS=* ]] || { echo "the lab's PRODUCTION_TIER was not found" >&2; exit 1; }

for b in breakwater-api breakwater-seed loadlab xtask; do
  [ -x "$BIN/$b" ] || { echo "$BIN/$b is missing: build it first (see Usage)" >&2; exit 2; }
done

# build_variant PATCH DIR [NAME=value...]: this commit's tree with PATCH applied, its API built
# into DIR/release (its own target directory, never over the main build; a second run's build
# is incremental), with the environment words given (say, for sqlx to check a changed query).
build_variant() {
  local patch=$1 dir=$2; shift 2
  echo "building the variant ($(basename "$patch")) into ${dir#"$ROOT"/}" >&2
  local tree=$dir/tree
  git -C "$ROOT" worktree remove --force "$tree" 2>/dev/null || rm -rf "$tree"
  git -C "$ROOT" worktree prune
  git -C "$ROOT" worktree add -q --detach "$tree" HEAD
  git -C "$tree" apply "$patch"
  (cd "$tree" && env "$@" CARGO_TARGET_DIR="$dir" cargo build -q --release --locked -p breakwater-api --bin breakwater-api) \
    2> "$WORK/build.log" || { cat "$WORK/build.log" >&2; exit 1; }
  git -C "$ROOT" worktree remove --force "$tree"
}

# seed_streams_data: DB seeded afresh with 50 tenants (5,000 conversations, 20,000 messages),
# and $WORK/tokens.jsonl with one agent of each tenant (loadlab mints their tokens with the
# development secret): the streams experiments' data set.
seed_streams_data() {
  echo "seeding $DB (50 tenants, 5,000 conversations, 20,000 messages)" >&2
  psql -q "$PGURL/postgres" -c "DROP DATABASE IF EXISTS $DB"
  "$BIN/breakwater-seed" --database-url "$PGURL/$DB" --small --tenants 50 --conversations 5000 --messages 20000 -q \
    > "$WORK/seed.log"
  psql -qAt -v ON_ERROR_STOP=1 "$PGURL/$DB" -c \
    "SELECT json_build_object('tenant_id', tenant_id, 'user_id', id) FROM (
       SELECT DISTINCT ON (tenant_id) tenant_id, id FROM users WHERE role = 'agent' ORDER BY tenant_id, id) u" \
    > "$WORK/tokens.jsonl"
}

# start_api NAME SERVER [NAME=value...]: a fresh API (the binary SERVER) pinned at 0.25 core /
# 512 MiB with the production tier and the settings given (which win over the tier's), on PORT
# (ops on PORT + 1) against DB; returns once it is ready. Its log: $WORK/NAME.api.log.
start_api() {
  local name=$1 server=$2; shift 2
  env DATABASE_URL="$PGURL/$DB" APP_ENV=development BIND_ADDR="127.0.0.1:$PORT" OPS_ADDR="127.0.0.1:$((PORT + 1))" \
    $TIER "$@" LOG_FORMAT=json "$BIN/xtask" pinned -- "$server" serve > "$WORK/$name.api.log" 2>&1 &
  API=$!
  local i
  for i in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$((PORT + 1))/ready" > /dev/null 2>&1 && return 0
    sleep 0.3
  done
  echo "the $name API did not become ready; its log:" >&2
  tail "$WORK/$name.api.log" >&2
  exit 1
}

# stop_api NAME: SIGTERM to the API, then the pinned wrapper's account of it (CPU used, periods
# throttled; warm-up included).
stop_api() {
  kill -TERM "$API"; wait "$API" || true; API=
  grep -v '^{' "$WORK/$1.api.log" | grep -v '^pinned: \(running\|SIGTERM\)' | sed 's/^/  /' || true
}
