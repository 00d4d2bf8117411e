//! Calls into redb that may panic, caught. redb asserts on pages it does
//! not recognise (a file changed outside it); for the disk tier (a cache)
//! and the ledger's settle journal that is a damaged file to move aside,
//! never a reason to stop the gateway or to print a panic into its log
//! ([`open_or_move_aside`]).

use redb::Database;
use std::path::Path;

thread_local! {
    /// Set while [`guarded`] runs on this thread: the panic hook keeps
    /// quiet about a panic that is caught and reported as corruption.
    static GUARDED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`, a call into redb, catching a panic: `None` when it panicked.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Option<T> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = GUARDED.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok();
    GUARDED.with(|g| g.set(was));
    result
}

/// Opens (or creates) the redb file at `path`, its folder created, checked
/// whole at open; a file redb refuses as damaged or of another format, or
/// panics on, is moved aside (`<name>.redb.corrupt`, or `.corrupt.1`,
/// `.corrupt.2`, ... when earlier damage is kept there: none is
/// overwritten) and a new one started, after `moved(why, aside)` is told. `Err`: the path
/// cannot be used (a permission, a missing or read-only volume, another
/// process holding the file).
pub(crate) fn open_or_move_aside(
    path: &Path,
    cache_bytes: Option<usize>,
    moved: impl FnOnce(&str, &Path),
) -> Result<Database, String> {
    if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(folder).map_err(|e| format!("cannot create {}: {e}", folder.display()))?;
    }
    let open = || {
        guarded(|| {
            let mut builder = Database::builder();
            if let Some(bytes) = cache_bytes {
                builder.set_cache_size(bytes);
            }
            builder.set_check_integrity_on_open(true).create(path)
        })
    };
    // Bytes that are no redb file read as invalid data or a short file:
    // damage, like a page that fails its check; any other I/O error is the
    // path's (a permission, a missing volume).
    let damage = |e: &std::io::Error| {
        matches!(
            e.kind(),
            std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof
        )
    };
    match open() {
        Some(Ok(db)) => Ok(db),
        Some(Err(redb::DatabaseError::Storage(redb::StorageError::Io(e)))) if !damage(&e) => Err(e.to_string()),
        Some(Err(e @ redb::DatabaseError::DatabaseAlreadyOpen)) => Err(format!("{e} (another process uses this file)")),
        damaged => {
            let why = match damaged {
                Some(Err(e)) => e.to_string(),
                _ => "redb panicked reading it".to_string(),
            };
            let aside = free_aside(path);
            moved(&why, &aside);
            std::fs::rename(path, &aside).map_err(|e| format!("cannot move {} aside: {e}", path.display()))?;
            match open() {
                Some(result) => result.map_err(|e| e.to_string()),
                None => Err("redb panicked creating a new file".into()),
            }
        }
    }
}

/// The first `<name>.redb.corrupt[.N]` that holds nothing yet.
fn free_aside(path: &Path) -> std::path::PathBuf {
    let first = path.with_extension("redb.corrupt");
    std::iter::once(first.clone())
        .chain((1..).map(|n| path.with_extension(format!("redb.corrupt.{n}"))))
        .find(|p| !p.exists())
        .unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_damage_is_moved_beside_the_first_not_over_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("x.redb");
        let mut asides = Vec::new();
        for garbage in [0x5a_u8, 0xa5] {
            std::fs::write(&path, vec![garbage; 9000]).expect("garbage");
            let db = open_or_move_aside(&path, None, |_, aside| asides.push(aside.to_path_buf()));
            drop(db.expect("a new file"));
        }
        assert_eq!(
            asides,
            [dir.path().join("x.redb.corrupt"), dir.path().join("x.redb.corrupt.1")]
        );
        assert_eq!(std::fs::read(&asides[0]).expect("first kept")[0], 0x5a);
        assert_eq!(std::fs::read(&asides[1]).expect("second kept")[0], 0xa5);
    }
}
