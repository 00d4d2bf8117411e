//! The data volume the disk tier's file sits on: how much room is free on
//! it. The disk tier stops writing at `cache.disk_reserve_bytes` (the
//! ledger usually shares the volume), and both the config's load and the
//! tier's open warn when its budget cannot fit beside that reserve.
//!
//! A module of its own, below `config` and `cache`, because both ask it
//! (`cache` already imports `config`, so neither can hold it for the other).

use std::path::Path;

/// Bytes free to this process on the volume that holds (or will hold)
/// `path`: its nearest folder that exists.
pub(crate) fn free_space(path: &Path) -> Option<u64> {
    let folder = path
        .ancestors()
        .skip(1)
        .find(|p| !p.as_os_str().is_empty() && p.is_dir())?;
    let stat = rustix::fs::statvfs(folder).ok()?;
    Some(stat.f_bavail.saturating_mul(stat.f_frsize))
}

/// A warning when the disk tier's file at `path` cannot grow to
/// `max_bytes` and still leave `reserve` free on its volume (the ledger's
/// room): it will stop writing at the reserve instead.
pub(crate) fn disk_room_warning(path: &Path, max_bytes: u64, reserve: u64) -> Option<String> {
    let free = free_space(path)?;
    let held = std::fs::metadata(path).map_or(0, |m| m.len());
    (free.saturating_add(held) < max_bytes.saturating_add(reserve)).then(|| {
        format!(
            "cache.disk_max_bytes: {max_bytes} bytes do not fit beside cache.disk_reserve_bytes ({reserve}) on the volume of {} ({free} bytes free): the disk tier will stop writing at the reserve",
            path.display()
        )
    })
}
