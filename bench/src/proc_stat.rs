//! A process's figures from `/proc`: peak and current RSS, CPU time, threads, context switches.

use anyhow::Context;

/// Clock ticks per second of `/proc/<pid>/stat` (`getconf CLK_TCK`; 100 on every Linux the
/// benchmark runs on, asked once all the same).
pub fn clk_tck() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100)
}

/// Peak RSS, current RSS (kB), CPU seconds (user + system) and more of one process.
pub struct ProcSample {
    pub vmhwm_kb: u64,
    pub vmrss_kb: u64,
    pub cpu_seconds: f64,
    pub threads: u64,
    /// Context switches of all threads so far (voluntary + involuntary).
    pub context_switches: u64,
}

/// Sum of a `/proc/<pid>/task/*/status` counter over the process's threads.
fn thread_counter(pid: u32, names: &[&str]) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| names.iter().any(|n| l.starts_with(n)))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// CPU seconds (user + system) used so far by process `pid`.
pub fn cpu_seconds(pid: u32, clk_tck: u64) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is gone"))?;
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("unexpected /proc/<pid>/stat format")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state); utime is field 14, stime field 15.
    let ticks = |i: usize| {
        f.get(i - 3)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Ok((ticks(14) + ticks(15)) as f64 / clk_tck as f64)
}

pub fn sample_proc(pid: u32, clk_tck: u64) -> anyhow::Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("process {pid} is gone"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Ok(ProcSample {
        vmhwm_kb: field("VmHWM:"),
        vmrss_kb: field("VmRSS:"),
        cpu_seconds: cpu_seconds(pid, clk_tck)?,
        threads: field("Threads:"),
        context_switches: thread_counter(
            pid,
            &["voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:"],
        ),
    })
}
