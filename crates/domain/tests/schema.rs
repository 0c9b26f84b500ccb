//! Invariants of the schema itself, read from PostgreSQL's catalog.

use sqlx::PgPool;

/// Foreign keys (as `table.constraint (columns)`) with no index whose leading columns are the
/// key's columns. `$1` restricts the search to one table, or NULL for all.
const FOREIGN_KEYS_WITHOUT_INDEX: &str = r"
    SELECT c.conrelid::regclass || '.' || c.conname || ' (' ||
           (SELECT string_agg(a.attname, ', ' ORDER BY k.ord)
            FROM unnest(c.conkey) WITH ORDINALITY k(attnum, ord)
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum) || ')'
    FROM pg_constraint c
    WHERE c.contype = 'f'
      AND ($1::regclass IS NULL OR c.conrelid = $1::regclass)
      AND NOT EXISTS (
          SELECT 1 FROM pg_index i
          WHERE i.indrelid = c.conrelid
            AND (i.indkey::int2[])[0:array_length(c.conkey, 1) - 1] @> c.conkey
            AND (i.indkey::int2[])[0:array_length(c.conkey, 1) - 1] <@ c.conkey)
    ORDER BY 1";

/// The field report found 57 foreign keys without an index: each makes a parent delete (or a
/// privacy erasure) scan the child table. Every foreign key here must have an index whose
/// leading columns are exactly the key's columns.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn every_foreign_key_has_an_index_leading_with_its_columns(pool: PgPool) {
    let missing: Vec<String> =
        sqlx::query_scalar(FOREIGN_KEYS_WITHOUT_INDEX).bind(None::<String>).fetch_all(&pool).await.expect("catalog");
    assert!(missing.is_empty(), "foreign keys without a leading index: {missing:#?}");
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_constraint WHERE contype = 'f'")
        .fetch_one(&pool)
        .await
        .expect("count");
    assert!(total >= 13, "expected the schema's foreign keys, found {total}");
}

/// The check above must be able to fail: a foreign key added without an index is reported, and
/// one whose columns lead an index in another position is not accepted either.
#[sqlx::test(migrator = "breakwater_domain::MIGRATOR")]
async fn the_foreign_key_check_catches_a_missing_index(pool: PgPool) {
    sqlx::query(
        "CREATE TABLE probe (tenant_id uuid, x int, contact_id uuid,
                             FOREIGN KEY (tenant_id, contact_id) REFERENCES contacts (tenant_id, id))",
    )
    .execute(&pool)
    .await
    .expect("probe table");
    sqlx::query("CREATE INDEX probe_wrong_idx ON probe (tenant_id, x, contact_id)")
        .execute(&pool)
        .await
        .expect("index");
    let missing: Vec<String> =
        sqlx::query_scalar(FOREIGN_KEYS_WITHOUT_INDEX).bind("probe").fetch_all(&pool).await.expect("catalog");
    assert_eq!(missing.len(), 1, "{missing:?}");
    sqlx::query("CREATE INDEX probe_right_idx ON probe (contact_id, tenant_id)").execute(&pool).await.expect("index");
    let missing: Vec<String> =
        sqlx::query_scalar(FOREIGN_KEYS_WITHOUT_INDEX).bind("probe").fetch_all(&pool).await.expect("catalog");
    assert!(missing.is_empty(), "{missing:?}");
}
