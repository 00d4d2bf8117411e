//! Wall-clock milliseconds since the Unix epoch: the one clock that cache
//! entries, the Redis breaker, the org's back-off and the Redis ledger's
//! reservation expiries agree on. A module of its own so that none of them
//! has to import another for it.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix time in milliseconds (0 if the system clock is before 1970).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
