//! The profiles file: smoke, load, stress, spike, soak and breakpoint defined in one place,
//! so "stress" means the same staircase against any build. Rates are absolute (`rps`) or
//! fractions of the last measured capacity (`capacity`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::schedule::Arrivals;

/// The profiles shipped with the crate (`crates/loadlab/profiles.toml`).
pub const DEFAULT_PROFILES: &str = include_str!("../profiles.toml");

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfilesFile {
    #[serde(default)]
    pub defaults: Defaults,
    pub profiles: BTreeMap<String, Profile>,
}

/// Settings every profile inherits unless it sets its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Share of requests from the reader population (the rest come from agent journeys).
    #[serde(default = "d_reader_share")]
    pub reader_share: f64,
    /// Mean think time between an agent's steps.
    #[serde(default = "d_think")]
    pub think_time: String,
    /// Pause between stages, so queues drain and stages do not bleed into each other.
    #[serde(default = "d_pause")]
    pub pause: String,
    #[serde(default = "d_arrivals")]
    pub arrivals: Arrivals,
}

fn d_reader_share() -> f64 {
    0.3
}
fn d_think() -> String {
    "1s".into()
}
fn d_pause() -> String {
    "2s".into()
}
fn d_arrivals() -> Arrivals {
    Arrivals::Poisson
}

impl Default for Defaults {
    fn default() -> Self {
        Self { reader_share: d_reader_share(), think_time: d_think(), pause: d_pause(), arrivals: d_arrivals() }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub stages: Vec<Stage>,
    /// A staircase generated from `from` to `to` (breakpoint), after any `stages`.
    #[serde(default)]
    pub ramp: Option<RampSpec>,
    #[serde(default)]
    pub reader_share: Option<f64>,
    #[serde(default)]
    pub think_time: Option<String>,
    #[serde(default)]
    pub pause: Option<String>,
    #[serde(default)]
    pub arrivals: Option<Arrivals>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    #[serde(default)]
    pub name: Option<String>,
    pub duration: String,
    /// Total requests per second...
    #[serde(default)]
    pub rps: Option<f64>,
    /// ...or a fraction of the last measured capacity.
    #[serde(default)]
    pub capacity: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RampSpec {
    pub from: f64,
    pub to: f64,
    pub steps: usize,
    /// Duration of each step.
    pub step: String,
    /// `capacity` (fractions, the default) or `rps`.
    #[serde(default)]
    pub unit: RampUnit,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RampUnit {
    #[default]
    Capacity,
    Rps,
}

/// A stage with its rate resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedStage {
    pub label: String,
    pub rps: f64,
    pub duration: Duration,
}

/// A profile resolved against a capacity and a time scale.
#[derive(Debug, Clone)]
pub struct ResolvedProfile {
    pub name: String,
    pub stages: Vec<ResolvedStage>,
    pub reader_share: f64,
    pub think_time: Duration,
    pub pause: Duration,
    pub arrivals: Arrivals,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s.trim()).map_err(|e| format!("bad duration {s:?}: {e}"))
}

impl ProfilesFile {
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| format!("profiles file: {e}"))
    }

    pub fn load(path: Option<&Path>) -> Result<Self, String> {
        match path {
            Some(p) => {
                Self::parse(&std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?)
            }
            None => Self::parse(DEFAULT_PROFILES),
        }
    }

    /// Resolves `name`: fractions of capacity become rates, durations are multiplied by
    /// `time_scale` (0.1 runs a profile ten times faster, for rehearsals and CI).
    pub fn resolve(&self, name: &str, capacity_rps: Option<f64>, time_scale: f64) -> Result<ResolvedProfile, String> {
        let p = self.profiles.get(name).ok_or_else(|| {
            let known: Vec<&str> = self.profiles.keys().map(String::as_str).collect();
            format!("no profile {name:?} (known: {})", known.join(", "))
        })?;
        let scale = |d: Duration| d.mul_f64(time_scale.max(0.0));
        let rate = |rps: Option<f64>, cap: Option<f64>, what: &str| -> Result<f64, String> {
            match (rps, cap) {
                (Some(r), None) => Ok(r),
                (None, Some(f)) => capacity_rps.map(|c| c * f).ok_or_else(|| {
                    format!(
                        "profile {name:?} gives {what} as a fraction of capacity: pass --capacity N or --capacity-from REPORT.json"
                    )
                }),
                _ => Err(format!("profile {name:?}: {what} needs exactly one of `rps` or `capacity`")),
            }
        };
        let mut stages = Vec::new();
        for (i, s) in p.stages.iter().enumerate() {
            let label = s.name.clone().unwrap_or_else(|| format!("{name}-{}", i + 1));
            stages.push(ResolvedStage {
                rps: rate(s.rps, s.capacity, &format!("stage {label}"))?,
                duration: scale(parse_duration(&s.duration)?),
                label,
            });
        }
        if let Some(r) = &p.ramp {
            let step = scale(parse_duration(&r.step)?);
            for k in 0..r.steps {
                let x = if r.steps <= 1 { r.from } else { r.from + (r.to - r.from) * k as f64 / (r.steps - 1) as f64 };
                let rps = match r.unit {
                    RampUnit::Rps => x,
                    RampUnit::Capacity => rate(None, Some(x), "its ramp")?,
                };
                stages.push(ResolvedStage { label: format!("{name}-{rps:.0}rps"), rps, duration: step });
            }
        }
        if stages.is_empty() {
            return Err(format!("profile {name:?} has no stages"));
        }
        let d = &self.defaults;
        Ok(ResolvedProfile {
            name: name.to_owned(),
            stages,
            reader_share: p.reader_share.unwrap_or(d.reader_share).clamp(0.0, 1.0),
            think_time: parse_duration(p.think_time.as_deref().unwrap_or(&d.think_time))?,
            pause: scale(parse_duration(p.pause.as_deref().unwrap_or(&d.pause))?),
            arrivals: p.arrivals.unwrap_or(d.arrivals),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_file_defines_all_six_shapes() -> Result<(), String> {
        let f = ProfilesFile::load(None)?;
        for name in ["smoke", "load", "stress", "spike", "soak", "breakpoint"] {
            let p = f.resolve(name, Some(1000.0), 1.0)?;
            assert!(!p.stages.is_empty(), "{name}");
            assert!(p.stages.iter().all(|s| s.rps > 0.0 && s.duration > Duration::ZERO), "{name}");
        }
        // Fractions of capacity need a capacity; absolute rates do not.
        assert!(f.resolve("load", None, 1.0).is_err());
        assert!(f.resolve("smoke", None, 1.0).is_ok());
        let stress = f.resolve("stress", Some(1000.0), 0.1)?;
        let rates: Vec<f64> = stress.stages.iter().map(|s| s.rps).collect();
        assert!(rates.windows(2).all(|w| w[0] < w[1]), "a staircase: {rates:?}");
        Ok(())
    }
}
