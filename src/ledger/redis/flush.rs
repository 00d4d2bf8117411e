//! Credits saved by hits, written to the teams' `routes` hashes in the
//! background (`ledger::saved`): a hit never waits on Redis for them.

use crate::ledger::saved::{SavedTally, FLUSH_EVERY};
use crate::metrics::RedisOp;
use crate::redis_backend::keys::{Keys, LedgerKey};
use crate::redis_backend::RedisBackend;
use std::sync::Arc;

/// Writes the saved-credits tally every `FLUSH_EVERY` (one pipeline of
/// HINCRBY); what fails is kept for the next round. Ends with the ledger.
pub(super) async fn flush_saved(tally: std::sync::Weak<SavedTally>, redis: Arc<RedisBackend>, keys: Keys) {
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let Some(tally) = tally.upgrade() else { return };
        let rows = tally.take();
        if rows.is_empty() {
            continue;
        }
        // One pipeline per team: a pipeline must stay in one Cluster slot.
        let mut failed = Vec::new();
        for team_rows in rows.chunk_by(|a, b| a.0 == b.0) {
            let mut pipe = redis::pipe();
            for (team, day, route, credits) in team_rows {
                let key = keys.ledger(team, LedgerKey::Routes);
                pipe.cmd("HINCRBY")
                    .arg(key)
                    .arg(format!("{day}|{}|v", route.as_str()))
                    .arg(*credits)
                    .ignore();
            }
            let written = redis
                .call(RedisOp::LedgerSaved, |mut c| async move {
                    pipe.query_async::<()>(&mut c).await
                })
                .await;
            if written.is_err() {
                failed.extend_from_slice(team_rows);
            }
        }
        if !failed.is_empty() {
            tally.restore(failed);
        }
    }
}
