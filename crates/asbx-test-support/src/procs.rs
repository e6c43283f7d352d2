//! Looking at host processes from outside a sandbox, the way tests and
//! benchmarks check what a runner spawned.

use std::collections::HashMap;

/// Every process below `root` (children, grandchildren, ...), from `/proc`.
pub fn descendants_of(root: u32) -> Vec<i32> {
    let mut parent = HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // The ppid is the second field after the parenthesised command name.
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok())
        {
            parent.insert(pid, ppid);
        }
    }
    let root = root as i32;
    parent
        .keys()
        .copied()
        .filter(|&p| {
            let mut cur = p;
            for _ in 0..64 {
                match parent.get(&cur) {
                    Some(&pp) if pp == root => return true,
                    Some(&pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_grandchild() {
        let mut child = std::process::Command::new("bash")
            .args(["-c", "sleep 5 & wait"])
            .spawn()
            .unwrap();
        let me = std::process::id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let mut found = Vec::new();
        while std::time::Instant::now() < deadline {
            found = descendants_of(me);
            if found.len() >= 2 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        assert!(found.contains(&(child.id() as i32)), "{found:?}");
        assert!(found.len() >= 2, "bash and its sleep: {found:?}");
    }
}
