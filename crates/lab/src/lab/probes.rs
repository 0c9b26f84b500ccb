//! What the lab reads from the machine itself (`/proc`), beside what the load lab reports: the
//! machine's description, PostgreSQL's CPU and the machine's busy time.

use std::collections::BTreeMap;

use crate::record::Machine;

impl Machine {
    pub(crate) fn read(unpinned: Option<String>) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, m)| m.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".into());
        let mounts =
            crate::rig::pinned::parse_mounts(&std::fs::read_to_string("/proc/self/mounts").unwrap_or_default());
        let cgroup = if mounts.cpu.is_some() && mounts.memory.is_some() {
            "v1"
        } else if mounts.unified.is_some() {
            "v2"
        } else {
            "none"
        };
        Self {
            cores: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            cpu_model,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned(),
            cgroup: cgroup.into(),
            unpinned,
            load_average: (load_average(), String::new()),
        }
    }
}

/// The 1, 5 and 15 minute load averages.
pub(crate) fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// CPU seconds of every process named `postgres` (the server and its backends), by pid, from `/proc`.
pub(crate) fn postgres_cpu_seconds() -> Option<BTreeMap<u32, f64>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else { continue };
        if comm.trim() != "postgres" {
            continue;
        }
        if let Some(s) = breakwater_loadlab::procstat::cpu_seconds(Some(pid)) {
            out.insert(pid, s);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The machine's (busy, total) jiffies from the first line of `/proc/stat`.
pub(crate) fn machine_jiffies() -> Option<(u64, u64)> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().next()?.strip_prefix("cpu ")?;
    let v: Vec<u64> = line.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user already)
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total.saturating_sub(idle), total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_excludes_idle_and_iowait() {
        let text = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n";
        assert_eq!(parse_proc_stat(text), Some((150, 1000)));
        assert_eq!(parse_proc_stat("intr 1 2"), None);
    }
}
