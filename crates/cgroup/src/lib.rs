//! Reads Linux cgroups, v1 or v2, whichever the host mounts: where the hierarchies are, which
//! group a process is in, a group's CPU quota, CPU usage and throttling counters.
//!
//! Its user is `cargo xtask` (`pinned` and the lab), which makes groups and reads their counters.
//! Parsing is kept apart from reading files, so that it is tested without a cgroup filesystem.

use std::path::PathBuf;

/// The mounted cgroup hierarchies that matter here.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Mounts {
    /// v1 hierarchy holding the `cpu` controller.
    pub cpu: Option<PathBuf>,
    /// v1 hierarchy holding `cpuacct` (often the same as `cpu`).
    pub cpuacct: Option<PathBuf>,
    /// v1 hierarchy holding `memory`.
    pub memory: Option<PathBuf>,
    /// The unified (v2) hierarchy.
    pub unified: Option<PathBuf>,
}

/// Reads `/proc/self/mounts` lines: `device mountpoint fstype options ...`.
pub fn parse_mounts(text: &str) -> Mounts {
    let mut m = Mounts::default();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [_, point, fstype, options, ..] = fields[..] else { continue };
        let point = PathBuf::from(unescape_mount(point));
        match fstype {
            "cgroup2" => m.unified = m.unified.or(Some(point)),
            "cgroup" => {
                for opt in options.split(',') {
                    let slot = match opt {
                        "cpu" => &mut m.cpu,
                        "cpuacct" => &mut m.cpuacct,
                        "memory" => &mut m.memory,
                        _ => continue,
                    };
                    if slot.is_none() {
                        *slot = Some(point.clone());
                    }
                }
            }
            _ => {}
        }
    }
    m
}

/// `/proc/self/mounts` escapes spaces and a few other bytes as octal (`\040`).
fn unescape_mount(s: &str) -> String {
    let mut out = Vec::with_capacity(s.len());
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let value = b[i + 1..i + 4].iter().fold(0u16, |acc, d| acc * 8 + u16::from(d - b'0'));
            out.push(u8::try_from(value).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The calling process's cgroup path in the hierarchy holding `controller` (`""` for v2),
/// from `/proc/self/cgroup` lines `id:controllers:path`.
pub fn own_cgroup<'a>(proc_cgroup: &'a str, controller: &str) -> Option<&'a str> {
    proc_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        hit.then_some(path)
    })
}

/// A flat-keyed file such as `cpu.stat` or `memory.events`: `key value` per line.
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// `cpu.max` (v2): `quota period`, where the quota may be `max`.
pub fn parse_cpu_max(text: &str) -> Option<(Option<u64>, u64)> {
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period = parts.next()?.parse().ok()?;
    let quota = if quota == "max" { None } else { Some(quota.parse().ok()?) };
    Some((quota, period))
}

/// What the cgroup counted while the command ran.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// CFS periods in which the group was runnable.
    pub nr_periods: u64,
    /// Periods in which it used up its quota and was throttled.
    pub nr_throttled: u64,
    /// Total time throttled, in microseconds.
    pub throttled_us: u64,
    /// CPU time used, in microseconds, when the hierarchy counts it.
    pub usage_us: Option<u64>,
    /// Peak memory, in bytes, when the kernel records it.
    pub peak_bytes: Option<u64>,
    /// Times the memory limit was hit (v1 `failcnt`, v2 `max` events).
    pub limit_hits: Option<u64>,
    /// Processes killed by the OOM killer inside the group.
    pub oom_kills: Option<u64>,
}

impl Stats {
    /// Two groups' counters as one group's: CPU, periods and events add up (so the throttled
    /// share is the groups' together); the peak is the larger one's.
    #[must_use]
    pub fn together(self, other: Self) -> Self {
        let add = |a: Option<u64>, b: Option<u64>| a.zip(b).map(|(a, b)| a + b);
        Self {
            nr_periods: self.nr_periods + other.nr_periods,
            nr_throttled: self.nr_throttled + other.nr_throttled,
            throttled_us: self.throttled_us + other.throttled_us,
            usage_us: add(self.usage_us, other.usage_us),
            peak_bytes: self.peak_bytes.max(other.peak_bytes),
            limit_hits: add(self.limit_hits, other.limit_hits),
            oom_kills: add(self.oom_kills, other.oom_kills),
        }
    }

    /// Share of periods that ended throttled.
    pub fn throttled_ratio(&self) -> f64 {
        if self.nr_periods == 0 { 0.0 } else { self.nr_throttled as f64 / self.nr_periods as f64 }
    }
}

/// Reads `cpu.stat` of either version: v1 counts throttled time in ns, v2 in us.
pub fn parse_cpu_stat(text: &str) -> Stats {
    let throttled_us =
        keyed(text, "throttled_usec").or_else(|| keyed(text, "throttled_time").map(|ns| ns / 1000)).unwrap_or(0);
    Stats {
        nr_periods: keyed(text, "nr_periods").unwrap_or(0),
        nr_throttled: keyed(text, "nr_throttled").unwrap_or(0),
        throttled_us,
        usage_us: keyed(text, "usage_usec"),
        ..Stats::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn groups_counters_add_up_to_one_groups() {
        let stats = |periods, throttled, usage| Stats {
            nr_periods: periods,
            nr_throttled: throttled,
            usage_us: Some(usage),
            ..Stats::default()
        };
        let sum =
            [stats(100, 50, 1_000), stats(100, 10, 3_000), stats(200, 0, 500)].into_iter().reduce(Stats::together);
        let sum = sum.expect("three groups");
        assert_eq!((sum.nr_periods, sum.nr_throttled, sum.usage_us), (400, 60, Some(4_500)));
    }

    #[test]
    fn mounts_find_v1_controllers_and_v2() {
        let text = "\
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw 0 0";
        let m = parse_mounts(text);
        assert_eq!(m.cpu.as_deref(), Some(Path::new("/sys/fs/cgroup/cpu,cpuacct")));
        assert_eq!(m.cpuacct, m.cpu);
        assert_eq!(m.memory.as_deref(), Some(Path::new("/sys/fs/cgroup/memory")));
        assert_eq!(m.unified.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        let v2 = parse_mounts("cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n");
        assert_eq!((v2.cpu, v2.memory), (None, None));
        assert_eq!(v2.unified.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        assert_eq!(parse_mounts("x /a\\040b cgroup2 rw 0 0").unified.as_deref(), Some(Path::new("/a b")));
    }

    #[test]
    fn own_cgroup_per_controller() {
        let text = "9:name=systemd:/\n4:memory:/jobs/42\n2:cpu,cpuacct:/\n0::/user.slice/x.scope\n";
        assert_eq!(own_cgroup(text, "memory"), Some("/jobs/42"));
        assert_eq!(own_cgroup(text, "cpuacct"), Some("/"));
        assert_eq!(own_cgroup(text, ""), Some("/user.slice/x.scope"));
        assert_eq!(own_cgroup(text, "pids"), None);
    }

    #[test]
    fn cpu_stat_of_both_versions() {
        let v1 = "nr_periods 30\nnr_throttled 29\nthrottled_time 2250000000\nnr_bursts 0\n";
        let s = parse_cpu_stat(v1);
        assert_eq!((s.nr_periods, s.nr_throttled, s.throttled_us, s.usage_us), (30, 29, 2_250_000, None));
        let v2 = "usage_usec 750000\nuser_usec 700000\nsystem_usec 50000\nnr_periods 30\nnr_throttled 29\nthrottled_usec 2250000\n";
        let s = parse_cpu_stat(v2);
        assert_eq!((s.nr_periods, s.nr_throttled, s.throttled_us, s.usage_us), (30, 29, 2_250_000, Some(750_000)));
        assert!((s.throttled_ratio() - 29.0 / 30.0).abs() < 1e-9);
        assert_eq!(parse_cpu_max("25000 100000\n"), Some((Some(25_000), 100_000)));
        assert_eq!(parse_cpu_max("max 100000"), Some((None, 100_000)));
        assert_eq!(keyed("low 0\nmax 3\noom_kill 1\n", "oom_kill"), Some(1));
    }
}
