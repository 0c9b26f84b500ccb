//! The words of the dataset: people's names and emails, tenant names and message bodies.
//!
//! Names mix the naming patterns of a South-East Asian customer base (Malay patronymics,
//! Chinese surname-first order, Tamil and Western names, a few accented ones) so that the
//! contacts list, sorted by `lower(name) COLLATE "C"` and searched by prefix, sees a realistic
//! spread of first letters, repeated surnames and non-ASCII bytes.
//!
//! `names` holds the people, tenants and inboxes, `bodies` the message bodies.

mod bodies;
mod names;

use rand::Rng;
use rand::seq::IndexedRandom;

pub(crate) use self::bodies::body;
pub(crate) use self::names::{contact_email, inbox, person, tenant_names, work_email};

/// One of `list`'s words, picked uniformly.
fn pick_str(rng: &mut impl Rng, list: &'static [&'static str]) -> &'static str {
    list.choose(rng).copied().unwrap_or("x")
}
