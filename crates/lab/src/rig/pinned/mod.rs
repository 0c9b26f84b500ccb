//! `cargo xtask pinned -- <command...>`: run a command at the production task's shape without
//! Docker: in a fresh cgroup with a CPU quota (0.25 core) and a memory limit (512 MiB, no swap).
//!
//! Works with cgroup v1 (`cpu.cfs_quota_us`/`cpu.cfs_period_us`, `memory.limit_in_bytes`,
//! `memory.memsw.limit_in_bytes`) or v2 (`cpu.max`, `memory.max`, `memory.swap.max`), whichever
//! the host mounts. The limits are read back before the command starts; at the end the cgroup's
//! throttling counters and peak memory are printed and the cgroup is removed (also on Ctrl-C and
//! SIGTERM, which are forwarded to the command's process group).
//!
//! The cgroup is created inside the caller's own cgroup where the hierarchy allows it, so that
//! whatever already limits or accounts for the caller still does. The command itself (its
//! options, signals and summary) is [`command`].

use std::ffi::OsString;
use std::fmt;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
pub(crate) use breakwater_cgroup::{Stats, keyed, own_cgroup, parse_cpu_max, parse_cpu_stat, parse_mounts};

pub mod command;

/// Prefix of every cgroup this runner creates; the suffix is `<runner pid>-<sequence>`.
const PREFIX: &str = "breakwater-pinned-";
/// The kernel refuses CFS quotas below one millisecond.
const MIN_QUOTA_US: u64 = 1_000;

/// A CPU amount in thousandths of a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Millicores(u64);

impl Millicores {
    /// A quarter of a core: the production task (Fargate, 256 CPU units).
    pub(crate) const QUARTER: Self = Self(250);

    /// In cores.
    #[allow(clippy::cast_precision_loss)]
    pub(crate) fn cores(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl fmt::Display for Millicores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let frac = format!("{:03}", self.0 % 1000);
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() { write!(f, "{}", self.0 / 1000) } else { write!(f, "{}.{frac}", self.0 / 1000) }
    }
}

/// Parses `0.25`, `1`, `1.5` (cores) exactly, without floating point.
pub(crate) fn parse_cpus(s: &str) -> Result<Millicores, String> {
    let bad = || format!("`{s}` is not a CPU amount (cores, e.g. 0.25)");
    let (int, frac) = s.trim().split_once('.').unwrap_or((s.trim(), ""));
    if (int.is_empty() && frac.is_empty()) || frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let int: u64 = if int.is_empty() { 0 } else { int.parse().map_err(|_| bad())? };
    let frac: u64 = if frac.is_empty() { 0 } else { format!("{frac:0<3}").parse().map_err(|_| bad())? };
    let millis = int.checked_mul(1000).and_then(|m| m.checked_add(frac)).ok_or_else(bad)?;
    if millis == 0 {
        return Err("the CPU quota must be above zero".into());
    }
    Ok(Millicores(millis))
}

/// Parses `536870912`, `512M`, `512MiB`, `64k`, `1G` (binary units).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let bad = || format!("`{s}` is not a size (bytes, or with a K, M or G suffix)");
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let num: u64 = num.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(bad()),
    };
    let bytes = num.checked_mul(1 << shift).ok_or_else(bad)?;
    if bytes < 1 << 20 {
        return Err("the memory limit must be at least 1 MiB".into());
    }
    Ok(bytes)
}

/// What the cgroup enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// CPU time allowed per period, in microseconds.
    pub(crate) quota_us: u64,
    /// The period, in microseconds.
    pub(crate) period_us: u64,
    /// Memory limit in bytes (swap limited to nothing beyond it).
    pub(crate) memory_bytes: u64,
}

impl Limits {
    /// The quota for `cpus` over `period_us`, checked against the kernel's bounds.
    pub(crate) fn new(cpus: Millicores, period_us: u64, memory_bytes: u64) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (1_000..=1_000_000).contains(&period_us),
            "the CFS period must be between 1,000 and 1,000,000 us, not {period_us}"
        );
        let quota_us = period_us.checked_mul(cpus.0).context("CPU quota overflows")? / 1000;
        anyhow::ensure!(
            quota_us >= MIN_QUOTA_US,
            "a quota of {cpus} cores over {period_us} us is {quota_us} us, below the kernel's 1 ms minimum"
        );
        // The kernel keeps whole pages.
        Ok(Self { quota_us, period_us, memory_bytes: memory_bytes / 4096 * 4096 })
    }
}

/// Which interface the cgroup speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A cgroup made for one run; dropping it kills what is left inside and removes it.
#[derive(Debug)]
pub(crate) struct Pinned {
    version: Version,
    /// v1: the `cpu` group; v2: the group.
    cpu: PathBuf,
    /// v1: the `memory` group; v2: the same group.
    memory: PathBuf,
    /// v1 only: a `cpuacct` group when it is a separate hierarchy.
    cpuacct: Option<PathBuf>,
    /// The limits read back from the kernel.
    limits: Limits,
}

impl Pinned {
    /// Creates the cgroup with `limits`, reads them back and fails unless they are in force.
    pub(crate) fn create(limits: Limits) -> anyhow::Result<Self> {
        let mounts_text = std::fs::read_to_string("/proc/self/mounts").map_err(|e| {
            anyhow::anyhow!("cannot read /proc/self/mounts ({e}): `cargo xtask pinned` needs Linux with cgroups")
        })?;
        let proc_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mounts = parse_mounts(&mounts_text);
        // The pid names the runner (for the stale-group sweep); the counter, each group of it.
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("{PREFIX}{}-{seq}", std::process::id());
        let mut pinned = match (&mounts.cpu, &mounts.memory, &mounts.unified) {
            (Some(cpu), Some(memory), _) => {
                let cpu_dir = make_group(&parent_v1(cpu, &proc_cgroup, "cpu"), &name)?;
                // From here on, `Drop` removes whatever was made.
                let mut pinned =
                    Self { version: Version::V1, cpu: cpu_dir, memory: PathBuf::new(), cpuacct: None, limits };
                pinned.memory = make_group(&parent_v1(memory, &proc_cgroup, "memory"), &name)?;
                if let Some(acct) = mounts.cpuacct.as_ref().filter(|a| *a != cpu && *a != memory) {
                    pinned.cpuacct = Some(make_group(&parent_v1(acct, &proc_cgroup, "cpuacct"), &name)?);
                }
                pinned
            }
            (_, _, Some(unified)) => {
                let dir = make_group_v2(unified, &proc_cgroup, &name)?;
                Self { version: Version::V2, cpu: dir.clone(), memory: dir, cpuacct: None, limits }
            }
            _ => bail!(
                "no cgroup filesystem with the cpu and memory controllers is mounted (see /proc/self/mounts): \
                 `cargo xtask pinned` needs Linux with cgroup v1 (cpu, memory) or v2"
            ),
        };
        pinned.apply()?;
        Ok(pinned)
    }

    /// Writes the limits and reads them back.
    fn apply(&mut self) -> anyhow::Result<()> {
        let Limits { quota_us, period_us, memory_bytes } = self.limits;
        match self.version {
            Version::V1 => {
                write(&self.cpu.join("cpu.cfs_period_us"), &period_us.to_string())?;
                write(&self.cpu.join("cpu.cfs_quota_us"), &quota_us.to_string())?;
                write(&self.memory.join("memory.limit_in_bytes"), &memory_bytes.to_string())?;
                let memsw = self.memory.join("memory.memsw.limit_in_bytes");
                if memsw.exists() {
                    // Memory plus swap equal to memory: no swap, as on Fargate.
                    write(&memsw, &memory_bytes.to_string())?;
                    let swap = read_u64(&memsw)?;
                    anyhow::ensure!(swap == memory_bytes, "memory.memsw.limit_in_bytes reads {swap}");
                }
                let (q, p) =
                    (read_u64(&self.cpu.join("cpu.cfs_quota_us"))?, read_u64(&self.cpu.join("cpu.cfs_period_us"))?);
                anyhow::ensure!(
                    (q, p) == (quota_us, period_us),
                    "the CPU quota reads {q}/{p} us, not {quota_us}/{period_us}"
                );
                let m = read_u64(&self.memory.join("memory.limit_in_bytes"))?;
                anyhow::ensure!(m == memory_bytes, "memory.limit_in_bytes reads {m}, not {memory_bytes}");
            }
            Version::V2 => {
                write(&self.cpu.join("cpu.max"), &format!("{quota_us} {period_us}"))?;
                write(&self.memory.join("memory.max"), &memory_bytes.to_string())?;
                let swap = self.memory.join("memory.swap.max");
                if swap.exists() {
                    write(&swap, "0")?;
                    let s = read_u64(&swap)?;
                    anyhow::ensure!(s == 0, "memory.swap.max reads {s}");
                }
                let text = read(&self.cpu.join("cpu.max"))?;
                let got = parse_cpu_max(&text);
                anyhow::ensure!(
                    got == Some((Some(quota_us), period_us)),
                    "cpu.max reads `{}`, not `{quota_us} {period_us}`",
                    text.trim()
                );
                let m = read_u64(&self.memory.join("memory.max"))?;
                anyhow::ensure!(m == memory_bytes, "memory.max reads {m}, not {memory_bytes}");
            }
        }
        Ok(())
    }

    /// One line saying what is in force.
    pub(crate) fn describe(&self) -> String {
        let Limits { quota_us, period_us, memory_bytes } = self.limits;
        let version = match self.version {
            Version::V1 => "v1",
            Version::V2 => "v2",
        };
        format!(
            "cgroup {version} {}: cpu {quota_us}/{period_us} us ({:.3} cores), memory {} (no swap)",
            self.cpu.display(),
            quota_us as f64 / period_us as f64,
            mib(memory_bytes)
        )
    }

    /// Every group's `cgroup.procs`, which a process writes its pid to in order to join.
    fn procs_files(&self) -> Vec<PathBuf> {
        let mut dirs = vec![self.cpu.clone()];
        if self.memory != self.cpu {
            dirs.push(self.memory.clone());
        }
        dirs.extend(self.cpuacct.clone());
        dirs.into_iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// A command that joins the group and then execs `argv` (a small `sh` prologue: the child
    /// moves itself before exec, so nothing of the command runs outside the limits). It runs in
    /// its own process group, so that signals reach it once, forwarded by the runner.
    pub(crate) fn command(&self, argv: &[OsString]) -> anyhow::Result<tokio::process::Command> {
        let (program, _) = argv.split_first().context("no command given")?;
        let mut script = String::from("for f in");
        for f in self.procs_files() {
            let f = f.to_str().context("cgroup path is not UTF-8")?;
            anyhow::ensure!(!f.contains('\''), "cgroup path contains a quote: {f}");
            script.push_str(&format!(" '{f}'"));
        }
        script.push_str("; do echo $$ > \"$f\" || exit 125; done; exec \"$@\"");
        let mut cmd = tokio::process::Command::new("sh");
        cmd.arg("-c").arg(script).arg(program).args(argv).process_group(0).kill_on_drop(false);
        Ok(cmd)
    }

    /// Moves a running process that is not ours (a PostgreSQL backend) under the group's CPU
    /// quota. Where it came from is pushed to `adopted` before it moves, so that
    /// [`Adopted::restore`] can put it back even after a failure half-way. On cgroup v1 only its
    /// `cpu` (and `cpuacct`) membership changes; its memory stays accounted where it was.
    pub(crate) fn adopt_cpu(&self, pid: u32, adopted: &mut Vec<Adopted>) -> anyhow::Result<()> {
        let proc_cgroup = read(&Path::new("/proc").join(pid.to_string()).join("cgroup"))?;
        let mounts = parse_mounts(&read(Path::new("/proc/self/mounts"))?);
        let mut moves = Vec::new();
        match self.version {
            Version::V1 => {
                let mut hierarchies = vec![("cpu", mounts.cpu.clone(), self.cpu.clone())];
                if let Some(acct) = &self.cpuacct {
                    hierarchies.push(("cpuacct", mounts.cpuacct.clone(), acct.clone()));
                }
                for (controller, mount, group) in hierarchies {
                    let mount = mount.with_context(|| format!("no {controller} hierarchy is mounted"))?;
                    let from = own_cgroup(&proc_cgroup, controller)
                        .with_context(|| format!("process {pid} is in no {controller} cgroup"))?;
                    moves.push((mount.join(from.trim_start_matches('/')), group));
                }
            }
            Version::V2 => {
                let mount = mounts.unified.context("no cgroup v2 hierarchy is mounted")?;
                let from = own_cgroup(&proc_cgroup, "").with_context(|| format!("process {pid} is in no cgroup"))?;
                moves.push((mount.join(from.trim_start_matches('/')), self.cpu.clone()));
            }
        }
        adopted.push(Adopted { pid, back: moves.iter().map(|(from, _)| from.join("cgroup.procs")).collect() });
        for (_, to) in moves {
            write(&to.join("cgroup.procs"), &pid.to_string())?;
        }
        Ok(())
    }

    /// The processes in the group's CPU controller now.
    pub(crate) fn cpu_procs(&self) -> Vec<u32> {
        read(&self.cpu.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    }

    /// The counters so far.
    pub(crate) fn stats(&self) -> Stats {
        self.counters().read()
    }

    /// What reads the group's counters, apart from the group (for a sampler running beside it).
    pub(crate) fn counters(&self) -> Counters {
        Counters {
            version: self.version,
            cpu: self.cpu.clone(),
            memory: self.memory.clone(),
            cpuacct: self.cpuacct.clone(),
        }
    }

    /// Kills whatever is left in the group and removes it; returns what could not be removed.
    fn remove(&self) -> Vec<String> {
        let mut dirs = vec![self.cpu.clone()];
        if self.memory != self.cpu {
            dirs.push(self.memory.clone());
        }
        dirs.extend(self.cpuacct.clone());
        let mut failed = Vec::new();
        for dir in dirs.into_iter().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = remove_group(&dir) {
                failed.push(format!("{}: {e}", dir.display()));
            }
        }
        failed
    }
}

/// A process moved under a group's CPU quota by [`Pinned::adopt_cpu`].
#[derive(Debug)]
pub(crate) struct Adopted {
    pub(crate) pid: u32,
    /// The `cgroup.procs` files of the groups it came from.
    back: Vec<PathBuf>,
}

impl Adopted {
    /// Puts the process back where it was. A process that has exited is not an error.
    pub(crate) fn restore(&self) -> anyhow::Result<()> {
        for procs in &self.back {
            if let Err(e) = write(procs, &self.pid.to_string())
                && Path::new("/proc").join(self.pid.to_string()).exists()
            {
                return Err(e);
            }
        }
        Ok(())
    }
}

/// The paths of a group's counter files: reading them is all a sampler needs.
#[derive(Debug, Clone)]
pub(crate) struct Counters {
    version: Version,
    cpu: PathBuf,
    memory: PathBuf,
    cpuacct: Option<PathBuf>,
}

impl Counters {
    /// The counters so far (all zero once the group is gone).
    pub(crate) fn read(&self) -> Stats {
        let mut stats = parse_cpu_stat(&read(&self.cpu.join("cpu.stat")).unwrap_or_default());
        match self.version {
            Version::V1 => {
                let acct = self.cpuacct.as_ref().unwrap_or(&self.cpu).join("cpuacct.usage");
                stats.usage_us = read_u64(&acct).ok().map(|ns| ns / 1000);
                stats.peak_bytes = read_u64(&self.memory.join("memory.max_usage_in_bytes")).ok();
                // With swap limited to the memory limit, memory+swap may hit its limit first.
                let fail = |f: &str| read_u64(&self.memory.join(f)).ok();
                stats.limit_hits = fail("memory.failcnt").max(fail("memory.memsw.failcnt"));
                stats.oom_kills =
                    read(&self.memory.join("memory.oom_control")).ok().and_then(|t| keyed(&t, "oom_kill"));
            }
            Version::V2 => {
                stats.peak_bytes = read_u64(&self.memory.join("memory.peak")).ok();
                let events = read(&self.memory.join("memory.events")).unwrap_or_default();
                stats.limit_hits = keyed(&events, "max");
                stats.oom_kills = keyed(&events, "oom_kill");
            }
        }
        stats
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for failure in self.remove() {
            eprintln!("pinned: could not remove cgroup {failure} (remove it with rmdir)");
        }
    }
}

/// Where to nest in a v1 hierarchy: under the caller's own group.
fn parent_v1(mount: &Path, proc_cgroup: &str, controller: &str) -> PathBuf {
    let own = own_cgroup(proc_cgroup, controller).unwrap_or("/").trim_start_matches('/');
    let parent = mount.join(own);
    if parent.is_dir() { parent } else { mount.to_path_buf() }
}

/// v2: nest under the caller's own group when it can hand cpu and memory to children (a group
/// holding processes cannot, except the root), else under the hierarchy's root.
fn make_group_v2(mount: &Path, proc_cgroup: &str, name: &str) -> anyhow::Result<PathBuf> {
    let own = mount.join(own_cgroup(proc_cgroup, "").unwrap_or("/").trim_start_matches('/'));
    let mut last_err = None;
    for parent in [own.as_path(), mount] {
        let controllers = read(&parent.join("cgroup.controllers")).unwrap_or_default();
        let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
        if !has("cpu") || !has("memory") {
            last_err = Some(anyhow::anyhow!("{} offers no cpu and memory controllers", parent.display()));
            continue;
        }
        let enabled = read(&parent.join("cgroup.subtree_control")).unwrap_or_default();
        let on = |c: &str| enabled.split_whitespace().any(|x| x == c);
        if (!on("cpu") || !on("memory"))
            && let Err(e) = write(&parent.join("cgroup.subtree_control"), "+cpu +memory")
        {
            last_err = Some(e);
            continue;
        }
        return make_group(parent, name);
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no usable cgroup v2 parent")))
        .context("cgroup v2: cannot enable the cpu and memory controllers for a child group")
}

/// Creates `parent/name` after removing empty groups left by runs that were killed outright.
fn make_group(parent: &Path, name: &str) -> anyhow::Result<PathBuf> {
    remove_stale(parent);
    let dir = parent.join(name);
    match std::fs::create_dir(&dir) {
        Ok(()) => Ok(dir),
        Err(e) if e.kind() == ErrorKind::PermissionDenied || e.raw_os_error() == Some(30) => bail!(
            "cannot create the cgroup {} ({e}): `cargo xtask pinned` must run as root (sudo -E cargo xtask pinned ...)",
            dir.display()
        ),
        Err(e) => Err(e).with_context(|| format!("creating the cgroup {}", dir.display())),
    }
}

/// Removes `breakwater-pinned-<pid>-<n>` groups whose runner is gone and that hold no process.
fn remove_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)?.split('-').next()) else { continue };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        if read(&entry.path().join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty()) {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

/// Kills what is left in a group (a command's stray background processes) and removes it.
fn remove_group(dir: &Path) -> std::io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            // Busy until the killed processes are reaped.
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn read(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn read_u64(path: &Path) -> anyhow::Result<u64> {
    let text = read(path)?;
    text.trim().parse().with_context(|| format!("{} holds `{}`, not a number", path.display(), text.trim()))
}

fn write(path: &Path, value: &str) -> anyhow::Result<()> {
    std::fs::write(path, value).with_context(|| format!("writing `{value}` to {}", path.display()))
}

pub(crate) fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests;
