//! Reads Linux cgroups, v1 or v2, whichever the host mounts: where the hierarchies are, which
//! group a process is in, a group's CPU quota, CPU usage and throttling counters.
//!
//! Two users: `cargo xtask pinned` and the lab, which make groups and read their counters, and the
//! API, which reads its own group's quota and usage so that admission can keep the process under
//! its quota ([`CpuAccount`]). Parsing is kept apart from reading files, so that it is tested
//! without a cgroup filesystem.

use std::path::{Path, PathBuf};
use std::time::Duration;

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

/// The CPU quota and usage of the calling process's own cgroup: what a container's CPU limit is
/// made of. Reading the usage costs one small file read (a few microseconds).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuAccount {
    /// The quota in cores (quota / period), the tightest of the group and its ancestors that the
    /// process can see; `None` when none of them has one.
    pub cores: Option<f64>,
    /// The CFS period of that quota, in microseconds.
    pub period_us: Option<u64>,
    /// The file with the group's cumulative CPU usage: v1 `cpuacct.usage` (ns), v2 `cpu.stat`.
    usage: PathBuf,
    /// `cpu.stat`, with the throttling counters.
    stat: PathBuf,
    version2: bool,
}

impl CpuAccount {
    /// The calling process's group. `Ok(None)`: no cgroup filesystem with CPU accounting;
    /// `Err`: the files exist but could not be read.
    pub fn of_self() -> std::io::Result<Option<Self>> {
        let mounts = match std::fs::read_to_string("/proc/self/mounts") {
            Ok(text) => parse_mounts(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        Self::find(&mounts, &proc_cgroup)
    }

    /// The group of a process whose `/proc/<pid>/cgroup` reads `proc_cgroup`.
    pub fn find(mounts: &Mounts, proc_cgroup: &str) -> std::io::Result<Option<Self>> {
        // A process whose group is not listed is not measured: falling back to the hierarchy's
        // root would read the whole machine's usage.
        if let Some(cpu) = &mounts.cpu {
            let Some(own) = own_cgroup(proc_cgroup, "cpu") else { return Ok(None) };
            let group = group_dir(cpu, Some(own));
            let quota = tightest(cpu, &group, |dir| {
                // A kernel without CFS bandwidth control has no quota files: no quota.
                let (Some(quota), Some(period)) =
                    (read_i64(&dir.join("cpu.cfs_quota_us"))?, read_i64(&dir.join("cpu.cfs_period_us"))?)
                else {
                    return Ok(None);
                };
                Ok(u64::try_from(quota).ok().zip(u64::try_from(period).ok()))
            })?;
            let acct = mounts.cpuacct.as_ref().unwrap_or(cpu);
            let own_acct = own_cgroup(proc_cgroup, "cpuacct").unwrap_or(own);
            let usage = group_dir(acct, Some(own_acct)).join("cpuacct.usage");
            return Ok(Some(Self {
                cores: quota.map(|(c, _)| c),
                period_us: quota.map(|(_, p)| p),
                usage,
                stat: group.join("cpu.stat"),
                version2: false,
            }));
        }
        if let Some(unified) = &mounts.unified {
            let Some(own) = own_cgroup(proc_cgroup, "") else { return Ok(None) };
            let group = group_dir(unified, Some(own));
            let quota = tightest(unified, &group, |dir| match std::fs::read_to_string(dir.join("cpu.max")) {
                Ok(text) => Ok(parse_cpu_max(&text).and_then(|(q, p)| q.map(|q| (q, p)))),
                // The root group has no cpu.max.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            })?;
            let stat = group.join("cpu.stat");
            return Ok(Some(Self {
                cores: quota.map(|(c, _)| c),
                period_us: quota.map(|(_, p)| p),
                usage: stat.clone(),
                stat,
                version2: true,
            }));
        }
        Ok(None)
    }

    /// CPU time the group has used since it was made.
    pub fn usage(&self) -> std::io::Result<Duration> {
        let text = std::fs::read_to_string(&self.usage)?;
        let parsed = if self.version2 {
            keyed(&text, "usage_usec").map(Duration::from_micros)
        } else {
            text.trim().parse().ok().map(Duration::from_nanos)
        };
        parsed.ok_or_else(|| std::io::Error::other(format!("no CPU usage in {}", self.usage.display())))
    }

    /// The group's `cpu.stat` counters (throttled periods and time).
    pub fn stat(&self) -> std::io::Result<Stats> {
        std::fs::read_to_string(&self.stat).map(|text| parse_cpu_stat(&text))
    }
}

/// The directory of a group in a hierarchy. Inside a container without a cgroup namespace,
/// `/proc/self/cgroup` names the host's path while the container sees its own group as the
/// mount's root: fall back to the root then.
fn group_dir(mount: &Path, own: Option<&str>) -> PathBuf {
    let dir = mount.join(own.unwrap_or("/").trim_start_matches('/'));
    if dir.is_dir() { dir } else { mount.to_path_buf() }
}

/// The smallest quota, in cores, of `group` and its ancestors up to `mount` (a parent's quota
/// limits its children too), with its period.
fn tightest(
    mount: &Path,
    group: &Path,
    quota: impl Fn(&Path) -> std::io::Result<Option<(u64, u64)>>,
) -> std::io::Result<Option<(f64, u64)>> {
    let mut best: Option<(f64, u64)> = None;
    let mut dir = Some(group);
    while let Some(d) = dir {
        if let Some((q, p)) = quota(d)?.filter(|&(_, p)| p > 0) {
            #[allow(clippy::cast_precision_loss)]
            let cores = q as f64 / p as f64;
            if best.is_none_or(|(b, _)| cores < b) {
                best = Some((cores, p));
            }
        }
        dir = if d == mount { None } else { d.parent().filter(|p| p.starts_with(mount)) };
    }
    Ok(best)
}

/// A number from a file; `None` when the file does not exist.
fn read_i64(path: &Path) -> std::io::Result<Option<i64>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    text.trim()
        .parse()
        .map(Some)
        .map_err(|_| std::io::Error::other(format!("{} holds `{}`, not a number", path.display(), text.trim())))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_tightest_quota_of_a_group_and_its_ancestors() {
        let quotas = |d: &Path| -> std::io::Result<Option<(u64, u64)>> {
            Ok(match d.to_str() {
                Some("/cg/a/b") => Some((50_000, 100_000)),
                Some("/cg/a") => Some((25_000, 100_000)),
                _ => None,
            })
        };
        assert_eq!(tightest(Path::new("/cg"), Path::new("/cg/a/b"), quotas).expect("read"), Some((0.25, 100_000)));
        assert_eq!(tightest(Path::new("/cg"), Path::new("/cg/x"), quotas).expect("read"), None);
    }

    /// Whatever this process runs under, finding its account must not fail, and a found quota
    /// must be readable.
    #[test]
    fn the_own_account_reads_or_is_absent() {
        match CpuAccount::of_self() {
            Ok(Some(account)) => {
                assert!(account.cores.is_none_or(|c| c > 0.0));
                let a = account.usage().expect("usage");
                let b = account.usage().expect("usage");
                assert!(b >= a, "usage is cumulative");
                account.stat().expect("cpu.stat");
            }
            Ok(None) => eprintln!("no cgroup CPU accounting here"),
            Err(e) => panic!("reading the own cgroup: {e}"),
        }
    }

    /// A scratch directory laid out like a cgroup mount.
    fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
        let root = std::env::temp_dir().join(format!("breakwater-cgroup-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (path, text) in files {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().expect("a parent")).expect("mkdir");
            std::fs::write(file, text).expect("write");
        }
        root
    }

    #[test]
    fn a_v1_account_reads_quota_and_usage() {
        let root = scratch(
            "v1",
            &[
                ("cpu/cpu.cfs_quota_us", "-1\n"),
                ("cpu/cpu.cfs_period_us", "100000\n"),
                ("cpu/g/cpu.cfs_quota_us", "25000\n"),
                ("cpu/g/cpu.cfs_period_us", "100000\n"),
                ("cpu/g/cpu.stat", "nr_periods 10\nnr_throttled 4\nthrottled_time 3000000\n"),
                ("cpu/g/cpuacct.usage", "1500000000\n"),
            ],
        );
        let mounts = Mounts { cpu: Some(root.join("cpu")), cpuacct: Some(root.join("cpu")), ..Mounts::default() };
        let account = CpuAccount::find(&mounts, "3:cpu,cpuacct:/g\n").expect("read").expect("an account");
        assert_eq!((account.cores, account.period_us), (Some(0.25), Some(100_000)));
        assert_eq!(account.usage().expect("usage"), Duration::from_millis(1500));
        assert_eq!(account.stat().expect("stat").nr_throttled, 4);
        let root_group = CpuAccount::find(&mounts, "3:cpu,cpuacct:/\n").expect("read").expect("an account");
        assert_eq!(root_group.cores, None, "the root has no quota");
        assert!(CpuAccount::find(&Mounts::default(), "").expect("read").is_none(), "no cgroup filesystem");
        assert!(CpuAccount::find(&mounts, "4:memory:/g\n").expect("read").is_none(), "not in a cpu group");
        // A group without quota files (no CFS bandwidth control) has no quota, not an error.
        std::fs::create_dir_all(root.join("cpu/bare")).expect("mkdir");
        let bare = CpuAccount::find(&mounts, "3:cpu,cpuacct:/bare\n").expect("read").expect("an account");
        assert_eq!(bare.cores, None);
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn a_v2_account_reads_quota_and_usage() {
        let root = scratch(
            "v2",
            &[
                ("u/g/cpu.max", "50000 100000\n"),
                ("u/g/cpu.stat", "usage_usec 750000\nnr_periods 3\nnr_throttled 1\nthrottled_usec 20\n"),
                ("u/h/cpu.max", "max 100000\n"),
            ],
        );
        let mounts = Mounts { unified: Some(root.join("u")), ..Mounts::default() };
        let account = CpuAccount::find(&mounts, "0::/g\n").expect("read").expect("an account");
        assert_eq!(account.cores, Some(0.5));
        assert_eq!(account.usage().expect("usage"), Duration::from_millis(750));
        let unlimited = CpuAccount::find(&mounts, "0::/h\n").expect("read").expect("an account");
        assert_eq!(unlimited.cores, None, "max is no quota");
        let _ = std::fs::remove_dir_all(root);
    }
}
