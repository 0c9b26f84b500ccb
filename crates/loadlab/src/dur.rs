//! Serde for durations as humantime strings ("30s", "1m 30s").

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&humantime::format_duration(*d).to_string())
}

#[allow(dead_code)] // the config structs are serialised into reports, read back as JSON values
pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(serde::de::Error::custom)
}
