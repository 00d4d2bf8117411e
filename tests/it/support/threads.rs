//! This process's threads as the kernel sees them (`/proc/self/task`):
//! which per-core loops of an in-process gateway exist, and whether each
//! was woken to serve.

/// A thread of this process: its name and how often it was switched out
/// (it slept waiting for work, or was preempted).
#[derive(Debug)]
pub struct Thread {
    pub name: String,
    pub switches: u64,
}

/// The threads whose name is `name` exactly, or starts with it.
pub fn named(prefix: &str) -> Vec<Thread> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for task in tasks.flatten() {
        let dir = task.path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue; // ended meanwhile
        };
        let name = name.trim_end().to_string();
        if !name.starts_with(prefix) {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let switches = status
            .lines()
            .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        found.push(Thread { name, switches });
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// The per-core loops of the gateway whose team listener is on `port`
/// (`server.runtime = "per_core"` names them `core<i>:<port>`).
pub fn per_core_loops(port: u16) -> Vec<Thread> {
    named("core")
        .into_iter()
        .filter(|t| t.name.ends_with(&format!(":{port}")))
        .collect()
}
