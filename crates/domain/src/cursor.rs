//! Opaque keyset cursors.
//!
//! A cursor is the sort key of the last row of a page, base64url-encoded. It carries no tenant:
//! the query that consumes it filters by the caller's tenant, so a forged cursor can only move
//! the starting point within the caller's own data.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The sort key of a keyset page boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cursor {
    /// A timestamp and a tiebreaking id (conversations by activity, messages by time).
    Time(DateTime<Utc>, Uuid),
    /// A text key and a tiebreaking id (contacts by name or email).
    Text(String, Uuid),
}

/// A cursor that did not come from us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("cursor is not valid")]
pub struct BadCursor;

const MAX_CURSOR_LEN: usize = 1024;

impl Cursor {
    /// The opaque string form.
    #[must_use]
    pub fn encode(&self) -> String {
        let raw = match self {
            Self::Time(at, id) => format!("t:{}:{id}", at.timestamp_micros()),
            Self::Text(key, id) => format!("s:{id}:{key}"),
        };
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// Parses a string made by [`Cursor::encode`].
    ///
    /// # Errors
    /// [`BadCursor`] for anything else.
    pub fn decode(s: &str) -> Result<Self, BadCursor> {
        if s.len() > MAX_CURSOR_LEN {
            return Err(BadCursor);
        }
        let bytes = URL_SAFE_NO_PAD.decode(s).map_err(|_| BadCursor)?;
        let raw = String::from_utf8(bytes).map_err(|_| BadCursor)?;
        if let Some(rest) = raw.strip_prefix("t:") {
            let (micros, id) = rest.split_once(':').ok_or(BadCursor)?;
            let micros: i64 = micros.parse().map_err(|_| BadCursor)?;
            let at = DateTime::from_timestamp_micros(micros).ok_or(BadCursor)?;
            if !(start::oldest().0..=start::newest().0).contains(&at) {
                return Err(BadCursor);
            }
            let id = Uuid::parse_str(id).map_err(|_| BadCursor)?;
            Ok(Self::Time(at, id))
        } else if let Some(rest) = raw.strip_prefix("s:") {
            // A UUID's hyphenated form is 36 bytes; the key follows it and may contain ':'.
            let (id, key) = rest.split_at_checked(36).ok_or(BadCursor)?;
            let key = key.strip_prefix(':').filter(|k| !k.contains('\0')).ok_or(BadCursor)?;
            let id = Uuid::parse_str(id).map_err(|_| BadCursor)?;
            Ok(Self::Text(key.to_owned(), id))
        } else {
            Err(BadCursor)
        }
    }

    /// The time key, or [`BadCursor`] when the list is keyed by text.
    pub(crate) fn time(&self) -> Result<(DateTime<Utc>, Uuid), BadCursor> {
        match self {
            Self::Time(at, id) => Ok((*at, *id)),
            Self::Text(..) => Err(BadCursor),
        }
    }

    /// The text key, or [`BadCursor`] when the list is keyed by time.
    pub(crate) fn text(&self) -> Result<(&str, Uuid), BadCursor> {
        match self {
            Self::Text(key, id) => Ok((key, *id)),
            Self::Time(..) => Err(BadCursor),
        }
    }
}

/// Sentinels that sort before every real row, so page 1 is the same query as page N.
pub(crate) mod start {
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    /// Later than any activity (9999-12-31, inside PostgreSQL's range): the first page of a
    /// newest-first list.
    pub(crate) fn newest() -> (DateTime<Utc>, Uuid) {
        (DateTime::from_timestamp(253_402_300_799, 0).unwrap_or(DateTime::<Utc>::MAX_UTC), Uuid::max())
    }

    /// Earlier than any activity (0001-01-01): the first page of an oldest-first list.
    pub(crate) fn oldest() -> (DateTime<Utc>, Uuid) {
        (DateTime::from_timestamp(-62_135_596_800, 0).unwrap_or(DateTime::<Utc>::MIN_UTC), Uuid::nil())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn time_cursors_round_trip(micros in -62_135_596_800_000_000i64..253_402_300_799_000_000, id in any::<u128>()) {
            let at = DateTime::from_timestamp_micros(micros).expect("in range");
            let cursor = Cursor::Time(at, Uuid::from_u128(id));
            prop_assert_eq!(Cursor::decode(&cursor.encode()), Ok(cursor));
        }

        #[test]
        fn text_cursors_round_trip(key in "[^\u{0}]{0,200}", id in any::<u128>()) {
            let cursor = Cursor::Text(key, Uuid::from_u128(id));
            prop_assert_eq!(Cursor::decode(&cursor.encode()), Ok(cursor));
        }

        #[test]
        fn arbitrary_strings_never_panic(s in ".{0,300}") {
            let _ = Cursor::decode(&s);
        }

        #[test]
        fn arbitrary_payloads_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Cursor::decode(&URL_SAFE_NO_PAD.encode(bytes));
        }
    }

    #[test]
    fn rejects_times_outside_the_databases_range() {
        for micros in [i64::MIN / 2, -62_135_596_800_000_001, 253_402_300_800_000_000] {
            let at = DateTime::from_timestamp_micros(micros).expect("chrono range");
            let raw = Cursor::Time(at, Uuid::nil()).encode();
            assert_eq!(Cursor::decode(&raw), Err(BadCursor), "{at}");
        }
    }

    #[test]
    fn rejects_garbage() {
        for s in ["", "!!!", "dDox", "czpub3QtYS11dWlk", &"a".repeat(2000)] {
            assert_eq!(Cursor::decode(s), Err(BadCursor), "{s}");
        }
    }
}
