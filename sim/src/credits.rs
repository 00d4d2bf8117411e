//! Credit metering: one credit per record returned, kept in daily buckets of
//! the simulator's clock and counted over a rolling 30-day window.
//!
//! The check and the charge happen under one lock so concurrent requests can
//! never push spend past the limit: a request that would is refused whole
//! (402, nothing charged), which keeps `X-Credits-Remaining` non-negative.

use chrono::{Days, NaiveDate, Utc};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// Days a credit counts against the limit before it drops off.
pub const WINDOW_DAYS: u64 = 30;

pub struct Credits {
    limit: Option<u64>,
    /// Spend per day of the sim clock.
    days: BTreeMap<NaiveDate, u64>,
    /// How far the sim clock runs ahead of real time (advance_clock).
    offset_secs: u64,
    /// Lifetime total since the last reset (not windowed).
    total: u64,
}

/// What a successful charge leaves, for the response headers.
pub struct Charge {
    pub credits: u64,
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
}

impl Credits {
    pub fn new(limit: Option<u64>) -> Credits {
        Credits {
            limit,
            days: BTreeMap::new(),
            offset_secs: 0,
            total: 0,
        }
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    pub fn set_limit(&mut self, limit: Option<u64>) {
        self.limit = limit;
    }

    pub fn advance(&mut self, secs: u64) {
        self.offset_secs = self.offset_secs.saturating_add(secs);
    }

    pub fn clear_spend(&mut self) {
        self.days.clear();
        self.total = 0;
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn today(&self) -> NaiveDate {
        let secs = i64::try_from(self.offset_secs).unwrap_or(i64::MAX / 2);
        (Utc::now() + chrono::Duration::seconds(secs)).date_naive()
    }

    fn expires(day: NaiveDate) -> NaiveDate {
        day + Days::new(WINDOW_DAYS)
    }

    /// Spend still inside the window as of the sim clock's today.
    pub fn window_used(&self) -> u64 {
        let today = self.today();
        self.days
            .iter()
            .filter(|(d, _)| Self::expires(**d) > today)
            .map(|(_, c)| c)
            .sum()
    }

    /// Charges `n` credits, or returns `Err(limit)` if that would exceed it.
    pub fn try_charge(&mut self, n: u64) -> Result<Charge, u64> {
        let used = self.window_used();
        if let Some(limit) = self.limit {
            if used + n > limit {
                return Err(limit);
            }
        }
        let today = self.today();
        if n > 0 {
            *self.days.entry(today).or_default() += n;
            self.total += n;
        }
        // Old buckets no longer count; drop them so memory stays bounded.
        self.days.retain(|d, _| Self::expires(*d) > today);
        Ok(Charge {
            credits: n,
            limit: self.limit,
            remaining: self.limit.map(|l| l.saturating_sub(used + n)),
        })
    }

    /// The `/v2/usage` body.
    pub fn usage(&self) -> Value {
        let today = self.today();
        let used = self.window_used();
        let over = self.limit.is_some_and(|l| used >= l);
        let live: Vec<(&NaiveDate, &u64)> = self.days.iter().filter(|(d, _)| Self::expires(**d) > today).collect();
        // When over the limit, credits come back as the oldest day expires.
        let available_at = if over {
            live.first().map(|(d, _)| Self::expires(**d).to_string())
        } else {
            None
        };
        let daily: Vec<Value> = live
            .iter()
            .map(|(d, c)| json!({"date": d.to_string(), "credits": c, "expires": Self::expires(**d).to_string()}))
            .collect();
        json!({
            "credits_used": used,
            "credit_limit": self.limit,
            "is_over_limit": over,
            "available_at": available_at,
            "daily_usage": daily,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_charge_that_would_pass_the_limit_and_charges_nothing() {
        let mut c = Credits::new(Some(10));
        assert_eq!(c.try_charge(7).ok().and_then(|x| x.remaining), Some(3));
        assert_eq!(c.try_charge(4).err(), Some(10));
        assert_eq!(c.window_used(), 7);
        assert_eq!(c.try_charge(3).ok().and_then(|x| x.remaining), Some(0));
    }

    #[test]
    fn spend_drops_off_after_thirty_days() {
        let mut c = Credits::new(None);
        assert!(c.try_charge(5).is_ok());
        c.advance(29 * 86_400);
        assert_eq!(c.window_used(), 5);
        c.advance(2 * 86_400);
        assert_eq!(c.window_used(), 0);
        assert_eq!(c.total(), 5);
    }
}
