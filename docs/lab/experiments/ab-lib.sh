# Shared by the experiments' ab.sh scripts (sourced, after they set HERE to their own directory):
# where they run and write, and one lab run with its steps printed.

# ab_setup NAME: goes to the repository's root and sets ROOT, API (the lab's API binary) and OUT
# (target/NAME, created). Fails unless the lab's release binaries are built.
ab_setup() {
  ROOT=$(git -C "$HERE" rev-parse --show-toplevel)
  cd "$ROOT"
  API=target/release/breakwater-api
  OUT=$ROOT/target/$1
  mkdir -p "$OUT"
  [ -x "$API" ] && [ -x target/release/xtask ] || { echo "build the release binaries first (see Usage)" >&2; exit 2; }
}

# ab_run NAME ROUND CAPACITY ONLY [LAB_ARGS...]: one lab run of the adaptive variant at a given
# capacity, its report in OUT/NAME-ROUND/ and its log beside it; then one line per run in the
# report (sweep, ramp, ramp_one...) with each step's 2xx/s, refused share and admitted p99.
ab_run() {
  local name=$1 round=$2 capacity=$3 only=$4 run
  shift 4
  target/release/xtask lab --no-build --capacity "$capacity" --only "$only" --variants adaptive "$@" \
    --out "$OUT/$name-$round" > "$OUT/$name-$round.log" 2>&1
  for run in $(jq -r '.variants[0] | to_entries | map(select((.value | type) == "array" and (.value | length) > 0)) | .[].key' "$OUT/$name-$round/lab.json"); do
    jq -r --arg n "$name" --arg r "$round" --arg m "$run" -f "$HERE/../steps.jq" "$OUT/$name-$round/lab.json"
  done
}
