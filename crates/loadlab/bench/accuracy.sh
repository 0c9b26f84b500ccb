#!/usr/bin/env bash
# The load lab's accuracy against a trivial local server, side by side with oha
# (`cargo install oha --locked`), alternating rounds so both see the same machine.
#
#   crates/loadlab/bench/accuracy.sh [RATE] [SECONDS] [ROUNDS]
#   LOADLAB_ARGS="--max-in-flight 50" crates/loadlab/bench/accuracy.sh 10000 10 3
#
# Traffic goes only to 127.0.0.1, to a server this script starts on a free port and stops.
# Needs python3 to read the JSON. Prints one row per tool and round.
set -euo pipefail
RATE=${1:-10000}
SECS=${2:-10}
ROUNDS=${3:-3}
cd "$(dirname "$0")/../../.."
cargo build --quiet --release -p breakwater-loadlab --example trivial_server --bin loadlab
TMP=$(mktemp -d)
target/release/examples/trivial_server >"$TMP/server.out" &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null; rm -rf "$TMP"' EXIT
for _ in $(seq 50); do [ -s "$TMP/server.out" ] && break; sleep 0.1; done
read -r ADDR _ SPID <"$TMP/server.out"
URL="http://$ADDR/"
HAVE_OHA=$(command -v oha >/dev/null && echo 1 || echo 0)

row() { # tool round json time-file
  python3 - "$@" <<'PY'
import json, os, sys
tool, rnd, path, tfile = sys.argv[1:5]
user, sys_ = (float(x) for x in open(tfile).read().split()[-2:])
load = os.getloadavg()[0]
r = json.load(open(path))
if tool == "loadlab":
    s = r["steps"][0]
    n = s["completed"]
    row = (s["achieved_rps"], s["ok"]["corrected"]["p50_ms"], s["ok"]["corrected"]["p99_ms"],
           s["ok"]["uncorrected"]["p99_ms"], s["send_lag"]["p99_ms"], s["audit"]["connections_opened"],
           s["errors"]["count"])
else:
    sm, p = r["summary"], r["latencyPercentiles"]
    n = sum(r.get("statusCodeDistribution", {}).values())
    row = (sm["requestsPerSec"], p["p50"] * 1e3, p["p99"] * 1e3, float("nan"), float("nan"), float("nan"),
           sum(r.get("errorDistribution", {}).values()))
cpu = (user + sys_) * 1e6 / max(n, 1)
print(f"{tool:<8} {rnd:>5} {row[0]:>10.1f} {row[1]:>9.3f} {row[2]:>9.3f} {row[3]:>9.3f} {row[4]:>9.3f} {row[5]:>6} {row[6]:>6} {cpu:>8.1f} {load:>5.2f}")
PY
}

echo "rate $RATE/s for ${SECS}s against $URL, $ROUNDS rounds, loadlab flags: ${LOADLAB_ARGS:-none}"
printf "%-8s %5s %10s %9s %9s %9s %9s %6s %6s %8s %5s\n" tool round achieved p50_ms p99_ms p99unc lag_p99 conns errors cpu_us load1
for r in $(seq "$ROUNDS"); do
  # shellcheck disable=SC2086 # LOADLAB_ARGS is a list of flags
  /usr/bin/time -f "%U %S" -o "$TMP/ll.time" target/release/loadlab ramp --url "$URL" ${LOADLAB_ARGS:-} \
    --rates "$RATE" --step "${SECS}s" --pid "$SPID" --out "$TMP/ll.json" --quiet >/dev/null
  row loadlab "$r" "$TMP/ll.json" "$TMP/ll.time"
  sleep 2
  if [ "$HAVE_OHA" = 1 ]; then
    /usr/bin/time -f "%U %S" -o "$TMP/oha.time" oha -q "$RATE" -z "${SECS}s" --latency-correction \
      --no-tui -w --output-format json "$URL" >"$TMP/oha.json"
    row oha "$r" "$TMP/oha.json" "$TMP/oha.time"
    sleep 2
  fi
done
