//! Indexes and constraints are taken off the seeded tables for the bulk load and put back after.
//!
//! Their definitions are read from the catalog (`pg_get_indexdef`, `pg_get_constraintdef`) just
//! before they are dropped, so what is rebuilt is exactly what the migrations made, and they are
//! recorded, in the same transaction as the drops, in `breakwater_seed.detached`. Each row is
//! deleted when its object is back, and the schema is dropped when all are. A run that is
//! interrupted in between leaves the rows behind: the next run refuses the database until it is
//! given `--reset`, which truncates the data, drops whatever part of the recorded objects had
//! been rebuilt, and rebuilds them all after its own load.

use sqlx::{Connection, PgConnection};

use crate::Error;
use crate::copy::Table;

/// What a detached object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A plain index.
    Index,
    /// A primary key (or unique constraint): its unique index is built like any index, then
    /// attached as the constraint (`ADD CONSTRAINT ... USING INDEX`).
    Key,
    /// A foreign key: added `NOT VALID`, then validated (which locks less).
    Foreign,
}

impl Kind {
    fn parse(s: &str) -> Self {
        match s {
            "key" => Self::Key,
            "foreign" => Self::Foreign,
            _ => Self::Index,
        }
    }
}

/// An index or constraint that is off, and the statements that put it back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detached {
    /// Its name.
    pub name: String,
    /// What it is.
    pub kind: Kind,
    /// The table it is on (for a foreign key: the referencing table).
    pub table: String,
    /// For a foreign key, the referenced table.
    pub referenced: Option<String>,
    /// Builds the index, or adds the foreign key `NOT VALID`.
    pub create_sql: String,
    /// Attaches the key to its index, or validates the foreign key.
    pub attach_sql: Option<String>,
}

const BOOKKEEPING: &str = "CREATE SCHEMA IF NOT EXISTS breakwater_seed;
    CREATE TABLE IF NOT EXISTS breakwater_seed.detached (
        name        text PRIMARY KEY,
        kind        text NOT NULL CHECK (kind IN ('index', 'key', 'foreign')),
        table_name  text NOT NULL,
        referenced  text,
        create_sql  text NOT NULL,
        attach_sql  text,
        drop_sql    text NOT NULL
    )";

fn loaded_tables() -> Vec<String> {
    Table::ALL.iter().map(|t| t.name().to_owned()).collect()
}

/// Whether an earlier run left indexes or constraints off.
///
/// # Errors
/// A database error.
pub async fn interrupted(conn: &mut PgConnection) -> Result<bool, Error> {
    let found = sqlx::query_scalar!(r#"SELECT to_regclass('breakwater_seed.detached') IS NOT NULL AS "found!""#)
        .fetch_one(&mut *conn)
        .await?;
    Ok(found)
}

/// Drops every index, primary key and foreign key on (or pointing at) the seeded tables,
/// recording each first; with rows left by an interrupted run, first drops whatever of those
/// had been rebuilt. Returns everything that is now off.
///
/// # Errors
/// A database error; nothing is dropped then (one transaction).
pub async fn detach(conn: &mut PgConnection) -> Result<Vec<Detached>, Error> {
    let mut tx = conn.begin().await?;
    sqlx::raw_sql(BOOKKEEPING).execute(&mut *tx).await?;
    let leftovers: Vec<String> =
        sqlx::query_scalar("SELECT drop_sql FROM breakwater_seed.detached ORDER BY kind = 'foreign' DESC, name")
            .fetch_all(&mut *tx)
            .await?;
    for drop_sql in leftovers {
        sqlx::raw_sql(&drop_sql).execute(&mut *tx).await?;
    }

    let tables = loaded_tables();
    let foreign = sqlx::query!(
        r#"SELECT c.conname::text AS "name!", c.conrelid::regclass::text AS "table_name!",
                  c.confrelid::regclass::text AS "referenced!",
                  format('ALTER TABLE %s ADD CONSTRAINT %I %s NOT VALID',
                         c.conrelid::regclass, c.conname, pg_get_constraintdef(c.oid)) AS "create_sql!",
                  format('ALTER TABLE %s VALIDATE CONSTRAINT %I', c.conrelid::regclass, c.conname) AS "attach_sql!",
                  format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I', c.conrelid::regclass, c.conname)
                      AS "drop_sql!"
           FROM pg_constraint c
           WHERE c.contype = 'f'
             AND (c.conrelid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t)
                  OR c.confrelid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t))
           ORDER BY c.conname"#,
        &tables
    )
    .fetch_all(&mut *tx)
    .await?;
    for f in foreign {
        record(
            &mut tx,
            &f.name,
            "foreign",
            &f.table_name,
            Some(&f.referenced),
            &f.create_sql,
            Some(&f.attach_sql),
            &f.drop_sql,
        )
        .await?;
        sqlx::raw_sql(&f.drop_sql).execute(&mut *tx).await?;
    }

    let keys = sqlx::query!(
        r#"SELECT c.conname::text AS "name!", c.conrelid::regclass::text AS "table_name!",
                  pg_get_indexdef(c.conindid) AS "create_sql!",
                  format('ALTER TABLE %s ADD CONSTRAINT %I %s USING INDEX %I', c.conrelid::regclass, c.conname,
                         CASE c.contype WHEN 'p' THEN 'PRIMARY KEY' ELSE 'UNIQUE' END, ci.relname) AS "attach_sql!",
                  format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I; DROP INDEX IF EXISTS %I',
                         c.conrelid::regclass, c.conname, ci.relname) AS "drop_sql!"
           FROM pg_constraint c
           JOIN pg_class ci ON ci.oid = c.conindid
           WHERE c.contype IN ('p', 'u')
             AND c.conrelid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t)
           ORDER BY c.conname"#,
        &tables
    )
    .fetch_all(&mut *tx)
    .await?;
    for k in keys {
        record(&mut tx, &k.name, "key", &k.table_name, None, &k.create_sql, Some(&k.attach_sql), &k.drop_sql).await?;
        sqlx::raw_sql(&k.drop_sql).execute(&mut *tx).await?;
    }

    let indexes = sqlx::query!(
        r#"SELECT ci.relname::text AS "name!", i.indrelid::regclass::text AS "table_name!",
                  pg_get_indexdef(i.indexrelid) AS "create_sql!",
                  format('DROP INDEX IF EXISTS %s', i.indexrelid::regclass) AS "drop_sql!"
           FROM pg_index i
           JOIN pg_class ci ON ci.oid = i.indexrelid
           WHERE i.indrelid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t)
             AND NOT EXISTS (SELECT 1 FROM pg_constraint c
                             WHERE c.conindid = i.indexrelid AND c.contype IN ('p', 'u', 'x'))
           ORDER BY ci.relname"#,
        &tables
    )
    .fetch_all(&mut *tx)
    .await?;
    for i in indexes {
        record(&mut tx, &i.name, "index", &i.table_name, None, &i.create_sql, None, &i.drop_sql).await?;
        sqlx::raw_sql(&i.drop_sql).execute(&mut *tx).await?;
    }

    let detached = list(&mut tx).await?;
    tx.commit().await?;
    Ok(detached)
}

#[allow(clippy::too_many_arguments)]
async fn record(
    conn: &mut PgConnection,
    name: &str,
    kind: &str,
    table: &str,
    referenced: Option<&str>,
    create_sql: &str,
    attach_sql: Option<&str>,
    drop_sql: &str,
) -> Result<(), Error> {
    sqlx::query(
        "INSERT INTO breakwater_seed.detached (name, kind, table_name, referenced, create_sql, attach_sql, drop_sql)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (name) DO NOTHING",
    )
    .bind(name)
    .bind(kind)
    .bind(table)
    .bind(referenced)
    .bind(create_sql)
    .bind(attach_sql)
    .bind(drop_sql)
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct Row {
    name: String,
    kind: String,
    table_name: String,
    referenced: Option<String>,
    create_sql: String,
    attach_sql: Option<String>,
}

async fn list(conn: &mut PgConnection) -> Result<Vec<Detached>, Error> {
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT name, kind, table_name, referenced, create_sql, attach_sql
         FROM breakwater_seed.detached ORDER BY name",
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Detached {
            name: r.name,
            kind: Kind::parse(&r.kind),
            table: r.table_name,
            referenced: r.referenced,
            create_sql: r.create_sql,
            attach_sql: r.attach_sql,
        })
        .collect())
}

/// Marks an object as back on.
///
/// # Errors
/// A database error.
pub(crate) async fn restored(conn: &mut PgConnection, name: &str) -> Result<(), Error> {
    sqlx::query("DELETE FROM breakwater_seed.detached WHERE name = $1").bind(name).execute(conn).await?;
    Ok(())
}

/// Drops the bookkeeping once everything is back.
///
/// # Errors
/// [`Error::Incomplete`] if something is still off; a database error.
pub(crate) async fn finish(conn: &mut PgConnection) -> Result<(), Error> {
    let left = list(conn).await?;
    if !left.is_empty() {
        return Err(Error::Incomplete(left.into_iter().map(|d| d.name).collect()));
    }
    sqlx::raw_sql("DROP SCHEMA breakwater_seed CASCADE").execute(conn).await?;
    Ok(())
}
