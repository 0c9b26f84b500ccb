//! Contact erasures timed: the request and the erase job's deletion, on copies of the rows that
//! are put back after.

use std::time::{Duration, Instant};

use breakwater_domain::Pool;
use breakwater_domain::contacts;
use uuid::Uuid;

use super::cases::Subject;
use super::measure::{Timing, dedupe, explained, percentile, seq_scan};
use super::notices::Notices;

#[derive(Debug, Default)]
pub(super) struct Erasures {
    pub(super) request: Timing,
    pub(super) erase: Timing,
    pub(super) total: Timing,
    pub(super) largest: Duration,
    /// (conversations, messages) of each erased contact.
    pub(super) sizes: Vec<(i64, i64)>,
}

/// The bench's copy of the rows it erases, kept in the database so that an interrupted bench is
/// restored by the next one.
pub(super) const KEEP: &str = "CREATE SCHEMA IF NOT EXISTS breakwater_bench;
    CREATE TABLE IF NOT EXISTS breakwater_bench.contacts (LIKE public.contacts);
    CREATE TABLE IF NOT EXISTS breakwater_bench.conversations (LIKE public.conversations);
    CREATE TABLE IF NOT EXISTS breakwater_bench.messages (LIKE public.messages)";

/// Erases the subject's biggest contacts, one erasure per contact (an erased contact cannot be
/// erased again, and re-inserting it would lay its rows out unlike production's), timing the
/// request and the erase job's deletion; the last one is erased with auto_explain on.
pub(super) async fn erasures_of(
    pool: &Pool,
    notices: &Notices,
    subject: &Subject,
    count: usize,
) -> anyhow::Result<Erasures> {
    let ids: Vec<Uuid> = subject.big_contacts.iter().map(|c| c.0).collect();
    sqlx::raw_sql(KEEP).execute(pool).await?;
    let tenant = subject.tenant.0;
    sqlx::query("INSERT INTO breakwater_bench.contacts SELECT * FROM contacts WHERE tenant_id = $1 AND id = ANY($2)")
        .bind(tenant)
        .bind(&ids)
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO breakwater_bench.conversations
         SELECT * FROM conversations WHERE tenant_id = $1 AND contact_id = ANY($2)",
    )
    .bind(tenant)
    .bind(&ids)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO breakwater_bench.messages
         SELECT m.* FROM breakwater_bench.conversations c
         JOIN messages m ON m.tenant_id = c.tenant_id AND m.conversation_id = c.id",
    )
    .execute(pool)
    .await?;

    let (mut request, mut erase, mut total) = (Vec::new(), Vec::new(), Vec::new());
    let mut e = Erasures::default();
    for &(contact, conversations, messages) in subject.big_contacts.iter().take(count) {
        let t0 = Instant::now();
        contacts::request_erasure(pool, subject.tenant, contact).await?;
        let t1 = Instant::now();
        contacts::erase(pool, subject.tenant, contact, breakwater_domain::contacts::ERASE_BATCH).await?;
        let t2 = Instant::now();
        request.push(t1 - t0);
        erase.push(t2 - t1);
        total.push(t2 - t0);
        e.sizes.push((conversations, messages));
    }
    e.largest = total.first().copied().unwrap_or_default();
    let mut explain = String::new();
    if let Some(&(contact, conversations, messages)) = subject.big_contacts.get(count) {
        let plans = explained(pool, notices, async {
            contacts::request_erasure(pool, subject.tenant, contact).await?;
            contacts::erase(pool, subject.tenant, contact, breakwater_domain::contacts::ERASE_BATCH).await?;
            Ok(())
        })
        .await?;
        explain = format!(
            "-- {}-erasure: request + erase job of a contact with {conversations} conversations and {messages} \
             messages ({})\n\n{}",
            subject.key,
            subject.label,
            dedupe(&plans)
        );
    }
    for v in [&mut request, &mut erase, &mut total] {
        v.sort_unstable();
    }
    let timing = |v: &[Duration]| Timing { p50: percentile(v, 50), p99: percentile(v, 99), ..Timing::default() };
    e.request = timing(&request);
    e.erase = timing(&erase);
    e.total = Timing { seq_scan: seq_scan(&explain), explain, ..timing(&total) };
    Ok(e)
}

/// Puts back whatever an erasure bench took (also after an interrupted one), and recounts the
/// inbox counters.
pub(super) async fn restore(pool: &Pool) -> anyhow::Result<()> {
    let kept: bool =
        sqlx::query_scalar("SELECT to_regclass('breakwater_bench.contacts') IS NOT NULL").fetch_one(pool).await?;
    if !kept {
        return Ok(());
    }
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(
        "DELETE FROM jobs j USING breakwater_bench.contacts k
           WHERE j.kind = 'erase_contact' AND j.tenant_id = k.tenant_id AND j.payload->>'contact_id' = k.id::text;
         DELETE FROM messages m USING breakwater_bench.messages k WHERE m.tenant_id = k.tenant_id AND m.id = k.id;
         DELETE FROM conversations c USING breakwater_bench.conversations k
           WHERE c.tenant_id = k.tenant_id AND c.id = k.id;
         DELETE FROM contacts c USING breakwater_bench.contacts k WHERE c.tenant_id = k.tenant_id AND c.id = k.id;
         INSERT INTO contacts SELECT * FROM breakwater_bench.contacts;
         INSERT INTO conversations SELECT * FROM breakwater_bench.conversations;
         INSERT INTO messages SELECT * FROM breakwater_bench.messages;
         DROP SCHEMA breakwater_bench CASCADE",
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    // The rows came back around the domain, which took them out of the inbox counts when their
    // erasure was requested: count again.
    breakwater_domain::counts::rebuild(pool).await?;
    Ok(())
}
