#!/usr/bin/env bash
# What the live inbox's outbox costs a message post (docs/lab/history/2026-12-03-streams.md). pgbench,
# CLIENTS clients, every post into a random conversation of one tenant shaped like the seed's 55%
# one (the inbox counts' setup.sql: 10 inboxes, 117 agents, 200,000 conversations), written as
# `messages::post` wrote it until 38f4da0, one statement per row (it now writes the message, the
# conversation's update and the event in one statement: the same rows and index entries for the
# database, one round trip instead of three; pinned.sh measures the post end to end):
#   plain   post.sql alone, without the event (what a post cost before the stream);
#   locked  the first design: the event numbered in the writer's transaction, under the
#           tenant's head row (every post of the tenant takes that row until it commits);
#   outbox  the design kept: the event inserted unnumbered (`stream::append`), with one more
#           client running the sequencer (`stream::sequence`'s statement, read from
#           crates/domain/src/stream.rs, under its advisory lock) between 10 ms pauses, as each
#           task's sequencer polls.
# Prints the writers' throughput, mean latency and the share of busy sessions found waiting on a
# lock (sampled every 50 ms), then numbers what is left and checks that the ids have no gap.
#
# Usage: run.sh [ROUNDS]    env: SECONDS_EACH (15), CLIENTS (16), PGURL (the server)
set -euo pipefail
cd "$(dirname "$0")"
ROUNDS=${1:-2}
. ../lib.sh
fresh_database stream_outbox

# The sequencer's statement, from its one owner (the domain), as a pgbench script.
SEQUENCE=$SCRIPTS/sequence.sql
{
  echo 'BEGIN;'
  lock=$(sed -n 's/^const SEQUENCER_LOCK: i64 = \(.*\);/\1/p' ../../../../crates/domain/src/stream.rs | tr -d _)
  echo "SELECT pg_advisory_xact_lock($((lock)));"
  sed -n '/r#"WITH pending AS (/,/FROM numbered GROUP BY tenant_id"#/p' ../../../../crates/domain/src/stream.rs |
    sed -e 's/.*r#"WITH pending/WITH pending/' -e 's/"#,\{0,1\}$//' -e 's/\$1/5000/'
  echo ';'
  echo 'COMMIT;'
  echo '\sleep 10 ms'
} > "$SEQUENCE"
grep -q 'UPDATE stream_events' "$SEQUENCE" || { echo "the sequencer's statement was not found in the domain" >&2; exit 1; }

run() {
  local variant=$1
  $P -c "CHECKPOINT"
  if [ "$variant" = outbox ]; then
    PGAPPNAME=sequencer pgbench -n -M simple -c 1 -T "$SECONDS_EACH" -f "$SEQUENCE" "$PGURL/$DB" > /dev/null 2>&1 &
  fi
  measure "$(printf '%-7s' "$variant")" -f "$(script post "$variant")"
  wait
}

for _ in $(seq 1 "$ROUNDS"); do
  run plain; run locked; run outbox
done
# Number what is left, then: the ids run 1..last_id with no gap (count, highest and head agree).
grep -v "^.sleep" "$SEQUENCE" | $P > /dev/null
$P -At -c "SELECT count(*) = max(id) AND max(id) = (SELECT last_id FROM stream_heads) AS no_gap FROM stream_events"
