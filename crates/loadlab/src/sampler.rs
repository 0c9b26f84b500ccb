//! Server-side sampling during a run: `/v1/ops/status` flattened to dotted paths, and the
//! target's CPU and RSS from `/proc` given its pid. Stored per step so a report can say what
//! saturated. The sampler has its own client, so its requests never count as load.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::Method;

use crate::client::Http;
use crate::procstat;
use crate::report::{SeriesSummary, ServerSample};

/// Flattens every numeric (and boolean) field of a JSON document into `a.b.0.c -> f64`.
pub fn flatten(v: &serde_json::Value) -> BTreeMap<String, f64> {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut BTreeMap<String, f64>) {
        let key = |k: &str| {
            if prefix.is_empty() { k.to_owned() } else { format!("{prefix}.{k}") }
        };
        match v {
            serde_json::Value::Number(n) => {
                if let Some(f) = n.as_f64() {
                    out.insert(prefix.to_owned(), f);
                }
            }
            serde_json::Value::Bool(b) => {
                out.insert(prefix.to_owned(), if *b { 1.0 } else { 0.0 });
            }
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    walk(&key(k), v, out);
                }
            }
            serde_json::Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(&key(&i.to_string()), v, out);
                }
            }
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    walk("", v, &mut out);
    out
}

#[derive(Debug, Default)]
struct Shared {
    samples: Vec<ServerSample>,
    step: Option<usize>,
}

/// A background sampler; cheap to clone.
#[derive(Debug, Clone)]
pub struct Sampler {
    shared: Arc<Mutex<Shared>>,
    stop: Arc<tokio::sync::Notify>,
}

impl Sampler {
    /// Starts sampling every `interval`. With neither a URL nor a pid it records nothing.
    pub fn start(ops_url: Option<String>, pid: Option<u32>, interval: Duration, run_start: Instant) -> Self {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let stop = Arc::new(tokio::sync::Notify::new());
        if ops_url.is_some() || pid.is_some() {
            let (sh, st) = (Arc::clone(&shared), Arc::clone(&stop));
            tokio::spawn(async move {
                let http = Http::new(interval.max(Duration::from_millis(500)));
                let mut tick = tokio::time::interval(interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                let mut last_cpu: Option<(Instant, f64)> = None;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        () = st.notified() => break,
                    }
                    let mut values = BTreeMap::new();
                    if let Some(url) = &ops_url
                        && let Ok(r) = http.send(Method::GET, url, &[], None).await
                        && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&r.body)
                    {
                        values = flatten(&v);
                    }
                    if let Some(p) = pid {
                        let now = Instant::now();
                        if let Some(cpu) = procstat::cpu_seconds(Some(p)) {
                            values.insert("proc.cpu_seconds".into(), cpu);
                            if let Some((t0, c0)) = last_cpu {
                                let dt = now.duration_since(t0).as_secs_f64();
                                if dt > 0.0 {
                                    values.insert("proc.cpu_cores".into(), (cpu - c0) / dt);
                                }
                            }
                            last_cpu = Some((now, cpu));
                        }
                        if let Some(rss) = procstat::rss_bytes(Some(p)) {
                            values.insert("proc.rss_bytes".into(), rss);
                        }
                    }
                    if values.is_empty() {
                        continue;
                    }
                    let t_s = run_start.elapsed().as_secs_f64();
                    if let Ok(mut g) = sh.lock() {
                        let step = g.step;
                        g.samples.push(ServerSample { t_s, step, values });
                    }
                }
            });
        }
        Self { shared, stop }
    }

    /// Marks the step now running (`None` during pauses).
    pub fn set_step(&self, step: Option<usize>) {
        if let Ok(mut g) = self.shared.lock() {
            g.step = step;
        }
    }

    /// Mean, max and last of each series over the step's samples.
    pub fn summary(&self, step: usize) -> BTreeMap<String, SeriesSummary> {
        let Ok(g) = self.shared.lock() else {
            return BTreeMap::new();
        };
        let mut acc: BTreeMap<String, (f64, f64, f64, u32)> = BTreeMap::new();
        for s in g.samples.iter().filter(|s| s.step == Some(step)) {
            for (k, v) in &s.values {
                let e = acc.entry(k.clone()).or_insert((0.0, f64::MIN, 0.0, 0));
                e.0 += v;
                e.1 = e.1.max(*v);
                e.2 = *v;
                e.3 += 1;
            }
        }
        acc.into_iter()
            .map(|(k, (sum, max, last, n))| (k, SeriesSummary { mean: sum / f64::from(n), max, last }))
            .collect()
    }

    /// Stops sampling and hands back every sample.
    pub fn finish(&self) -> Vec<ServerSample> {
        self.stop.notify_waiters();
        self.stop.notify_one();
        self.shared.lock().map(|g| g.samples.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattens_whatever_numbers_exist() {
        let v = serde_json::json!({
            "capacity": {"limit": 5, "in_flight": 3, "queue_depth": 0, "shed": {"load_shed": 12}},
            "pool": {"size": 10, "idle": 2.5, "name": "pg"},
            "ready": true,
            "classes": [{"limit": 1}]
        });
        let f = flatten(&v);
        assert_eq!(f.get("capacity.limit"), Some(&5.0));
        assert_eq!(f.get("capacity.shed.load_shed"), Some(&12.0));
        assert_eq!(f.get("pool.idle"), Some(&2.5));
        assert_eq!(f.get("ready"), Some(&1.0));
        assert_eq!(f.get("classes.0.limit"), Some(&1.0));
        assert!(!f.contains_key("pool.name"));
    }
}
