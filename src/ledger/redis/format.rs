//! The Redis ledger's format, recorded in Redis beside its keys (a hash
//! `<prefix>l:format`: `format`, `since`), as the files record theirs
//! (`crate::stored`). Checked at start, before the gateway serves: a
//! ledger a newer release wrote in a format this one cannot read refuses
//! the start with one line naming the release to run; one that records no
//! format has this release's recorded (format 1: the keys of every release
//! so far, 0.1.0's included, whose rollback reads them right).
//!
//! When Redis cannot be reached at start, the check is made again every
//! [`RETRY_EVERY`] until it answers; a newer format found then is logged at
//! error level every time it is read, and stops every reserve (a 503):
//! spend this release may misread is never booked.

use crate::metrics::RedisOp;
use crate::redis_backend::keys::Keys;
use crate::redis_backend::RedisBackend;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The format this release writes, and the newest it reads.
pub(crate) const FORMAT: u32 = 1;
/// The first release that writes [`FORMAT`].
const SINCE: &str = "0.1.0";
/// How often a check Redis did not answer is made again.
pub(crate) const RETRY_EVERY: Duration = Duration::from_secs(5);

/// What the check found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Checked {
    /// This release's format (recorded now if it was not).
    Readable,
    /// A newer release's: the line to print.
    Newer(String),
}

/// Reads the recorded format, recording [`FORMAT`] where none is; `Err`
/// when Redis did not answer.
pub(crate) async fn check(redis: &RedisBackend, keys: &Keys) -> Result<Checked, String> {
    let key = keys.ledger_format();
    let (format, since): (Option<String>, Option<String>) = redis
        .call(RedisOp::LedgerCheck, |mut c| {
            let mut pipe = redis::pipe();
            pipe.atomic()
                .cmd("HSETNX")
                .arg(&key)
                .arg("format")
                .arg(FORMAT)
                .ignore()
                .cmd("HSETNX")
                .arg(&key)
                .arg("since")
                .arg(SINCE)
                .ignore()
                .cmd("HGET")
                .arg(&key)
                .arg("format")
                .cmd("HGET")
                .arg(&key)
                .arg("since");
            async move { pipe.query_async(&mut c).await }
        })
        .await
        .map_err(|e| e.to_string())?;
    // A number this release cannot parse is a format it does not know.
    let format = format.map_or(FORMAT, |f| f.parse::<u32>().unwrap_or(u32::MAX));
    if format <= FORMAT {
        return Ok(Checked::Readable);
    }
    Ok(Checked::Newer(format!(
        "the credit ledger in Redis (key {key}) is in ledger format {}, which this permit-gateway {} \
         (formats up to {FORMAT}) cannot read: run {} on it (docs/operations.md, \"Upgrading\")",
        crate::stored::shown(format),
        crate::VERSION,
        crate::stored::release_to_run(since.as_deref().unwrap_or_default()),
    )))
}

/// At start: `Err(line)` for a newer format. When Redis does not answer,
/// the check goes on in the background; `refused` is set if it then finds
/// a newer format (every reserve is refused while it is).
pub(crate) async fn at_start(redis: Arc<RedisBackend>, keys: Keys, refused: Arc<AtomicBool>) -> Result<(), String> {
    match check(&redis, &keys).await {
        Ok(Checked::Readable) => Ok(()),
        Ok(Checked::Newer(line)) => Err(line),
        Err(e) => {
            tracing::warn!(error = %e, "credit ledger: Redis did not answer the format check; it is made again until it does");
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(RETRY_EVERY).await;
                    match check(&redis, &keys).await {
                        Ok(Checked::Readable) => return refused.store(false, Ordering::Relaxed),
                        Ok(Checked::Newer(line)) => {
                            refused.store(true, Ordering::Relaxed);
                            tracing::error!("credit ledger: every reserve refused: {line}");
                        }
                        Err(_) => {}
                    }
                }
            });
            Ok(())
        }
    }
}
