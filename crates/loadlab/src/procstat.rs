//! CPU time and resident memory of a process, read from Linux's `/proc`. Used for the
//! generator's own cost (self-audit) and for the target's, given its pid.

use std::path::PathBuf;

fn proc_dir(pid: Option<u32>) -> PathBuf {
    match pid {
        Some(p) => PathBuf::from(format!("/proc/{p}")),
        None => PathBuf::from("/proc/self"),
    }
}

/// Total CPU time (user + system) of every thread of the process, in seconds.
///
/// This process's own (`None`): its CPU-time clock, in nanoseconds, which keeps the time of
/// threads that have exited (a sum over the live threads drops it, so a step during which a
/// thread ended could measure less than nothing). Another process's: the sum of the nanosecond
/// counters in each live thread's `schedstat`, falling back to `stat`'s clock ticks (USER_HZ is
/// 100 on Linux) where `schedstat` is missing. `None` off Linux or for a gone pid.
pub fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    if pid.is_none() {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
        #[allow(clippy::cast_precision_loss)] // seconds of CPU: far below 2^52
        return Some(t.tv_sec as f64 + t.tv_nsec as f64 / 1e9);
    }
    let dir = proc_dir(pid);
    if let Ok(tasks) = std::fs::read_dir(dir.join("task")) {
        let mut ns: u64 = 0;
        let mut any = false;
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat"))
                && let Some(v) = s.split_whitespace().next().and_then(|f| f.parse::<u64>().ok())
            {
                ns += v;
                any = true;
            }
        }
        if any && ns > 0 {
            return Some(ns as f64 / 1e9);
        }
    }
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// Resident set size in bytes (`VmRSS`).
pub fn rss_bytes(pid: Option<u32>) -> Option<f64> {
    let status = std::fs::read_to_string(proc_dir(pid).join("status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_its_own_cpu_and_rss() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let before = cpu_seconds(None).unwrap_or_default();
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let after = cpu_seconds(None).unwrap_or_default();
        assert!(after >= before);
        assert!(rss_bytes(None).unwrap_or_default() > 0.0);
    }

    #[test]
    fn keeps_the_cpu_of_a_thread_that_has_exited() {
        if !cfg!(target_os = "linux") {
            return;
        }
        let before = cpu_seconds(None).expect("own CPU");
        // A thread that spins for 50 ms and ends before the second reading.
        std::thread::spawn(|| {
            let started = std::time::Instant::now();
            while started.elapsed() < std::time::Duration::from_millis(50) {
                std::hint::spin_loop();
            }
        })
        .join()
        .expect("join");
        let spent = cpu_seconds(None).expect("own CPU") - before;
        assert!(spent >= 0.01, "the exited thread's CPU was lost: {spent} s");
    }
}
