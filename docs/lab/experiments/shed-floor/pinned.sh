#!/usr/bin/env bash
# The floor under #22's shed p50 at 10x: how fast can any server pinned at 0.25 core / 512 MiB
# refuse while it also serves? The bare hyper server of the lab's refusal steps
# (`crates/loadlab/examples/canned_refusal.rs`) with an ideal admission in front of served work:
# `GET /work?us=WORK_US&per_sec=P` serves at most P a second (a GCRA, a tenth of a second's
# burst), each spinning WORK_US µs of CPU, and answers the rest with the API's 503 bytes at once.
# Nothing is queued, routed, verified or logged. Pinned as the lab pins the API (the production
# tier's one tokio worker thread), offered open-loop Poisson arrivals by `loadlab ramp` (the
# lab's in-flight cap of 2,048), one fresh server per step.
#
# A line per step: offered, achieved req/s and 2xx/s, the server's CPU and the share of CFS
# periods it was throttled in, the 2xx p99 and the refusals' p50 (from the intended send time),
# and whether the load lab's self-audit found the step valid.
#
# Usage, as root (the cgroup), after `cargo build --release --locked` and
# `cargo build --release -p breakwater-loadlab --example canned_refusal`:   pinned.sh [ROUNDS]
# env: RATES ("1200 2400 6000 12000": offered req/s), SERVED ("250 500 750 1000": P, the work
#      served a second at most), WORK_US (200), STEP (10s), PERIOD_US (100000: the CFS period)
source "$(dirname "$0")/../pinned-api.sh"
RATES=${RATES:-1200 2400 6000 12000}
SERVED=${SERVED:-250 500 750 1000}
WORK_US=${WORK_US:-200}
STEP=${STEP:-10s}
PERIOD_US=${PERIOD_US:-100000}
PORT=18950
FLOOR=$BIN/examples/canned_refusal
[ -x "$FLOOR" ] || { echo "$FLOOR is missing: build it first (see Usage)" >&2; exit 2; }

# periods CGROUP: the cgroup's CFS periods and those it was throttled in, as two words.
periods() { awk '$1 == "nr_periods" || $1 == "nr_throttled" {printf "%s ", $2}' "$1/cpu.stat"; }

for r in $(seq 1 "$ROUNDS"); do
  for served in $SERVED; do
    for rate in $RATES; do
      # shellcheck disable=SC2086 # TIER is words
      env $TIER "$BIN/xtask" pinned --period-us "$PERIOD_US" -- "$FLOOR" "$PORT" > "$WORK/floor.log" 2>&1 &
      API=$!
      for _ in $(seq 1 50); do grep -q ' pid ' "$WORK/floor.log" && break; sleep 0.1; done
      pid=$(sed -n 's/.* pid \([0-9]*\)$/\1/p' "$WORK/floor.log")
      cgroup=$(sed -n 's/^pinned: cgroup v[12] \([^:]*\):.*/\1/p' "$WORK/floor.log")
      [ -n "$pid" ] && [ -n "$cgroup" ] || { cat "$WORK/floor.log" >&2; exit 1; }
      before=$(periods "$cgroup")
      "$BIN/loadlab" ramp --url "http://127.0.0.1:$PORT/work?us=$WORK_US&per_sec=$served" --rates "$rate" \
        --step "$STEP" --pause 1s --arrivals poisson --max-in-flight 2048 --timeout 5s --pid "$pid" \
        --server-cpus 0.25 --out "$WORK/step.json" --quiet > /dev/null 2>&1 || true
      after=$(periods "$cgroup")
      kill -TERM "$API"; wait "$API" 2>/dev/null || true; API=
      jq -r --arg r "$r" --arg p "$served" --arg b "$before" --arg a "$after" '.steps[0] as $s
        | ($b | split(" ") | map(select(. != "") | tonumber)) as $b
        | ($a | split(" ") | map(select(. != "") | tonumber)) as $a
        | "round \($r): served at most \($p)/s, offered \($s.offered_rps): \($s.achieved_rps | round) req/s, \($s.goodput_rps | round) 2xx/s; CPU \($s.server["proc.cpu_cores"].mean * 1000 | round / 1000) cores, throttled in \((100 * ($a[1] - $b[1]) / ([1, $a[0] - $b[0]] | max)) | round)% of periods; 2xx p99 \($s.ok.corrected.p99_ms * 10 | round / 10) ms; shed p50 \($s.refused.corrected.p50_ms * 10 | round / 10) ms; \(if $s.audit.valid then "valid" else "invalid (\($s.audit.reasons | join("; ")))" end)"' \
        "$WORK/step.json"
    done
  done
done
