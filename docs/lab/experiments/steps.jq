# One line for one run of a lab report (lab.json), for the experiments' ab.sh scripts:
# "NAME round ROUND RUN: " and each step's 2xx/s, refused share and admitted p99.
# Usage: jq -r --arg n NAME --arg r ROUND --arg m RUN -f steps.jq lab.json
# (RUN: the report's run, such as sweep, ramp or ramp_one; the first variant's.)
.variants[0][$m]
| map("\(.label) \(.ok_rps | round)/s \(100 * .refused_share * 10 | round / 10)% p99 \(.ok_p99_ms | round)ms")
| "\($n) round \($r) \($m): " + join(", ")
