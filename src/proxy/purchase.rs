//! One purchase: the sequence that keeps the money invariants, written
//! once for every upstream call a team request pays for.
//!
//! ```text
//!  open     org probe (the company out of credits: its 402, no call)
//!    │      reserve    the worst case, in every budget the member counts against
//!  turn     a fair turn at the upstream rate        refused ─► release
//!  call     forward; the bill from the head (or the records)
//!    │      check      error statuses become errors, a 200 must be JSON
//!  settle   each stake at its share of the bill      nothing billed ─► release
//! ```
//!
//! Its two callers are the single miss (`fetch`: one stake, one call) and
//! the batch of id lookups (`reuse::batch`: one stake per request, one call
//! for all). A [`Stake`] ends in [`Stake::release`] or in [`Called::settle`],
//! nowhere else.
//!
//! **Who pays what, one rule** ([`shares`]). The charges of one call sum to
//! its bill as far as the stakes' reservations cover it:
//! - first, the records each request gets are its own (a bill below the
//!   records is split in proportion to them);
//! - then what the bill holds above the records (the upstream billed what
//!   it did not send, or sent nothing to count: foreign records, a cut
//!   body) is split in proportion to what each request asked (its ids; a
//!   page's one request asks the whole bill), each up to its reservation;
//! - only what no reservation covers is left to the reconciliation of
//!   untracked credits (`gateway_untracked_credits`), logged and counted
//!   as an anomaly.
//!
//! So a lookup alone and the same lookup in a batch cost the same, and a
//! team never pays beyond the worst case it reserved. A lone stake is
//! settled as soon as the answer's head shows its bill (before its body: a
//! crash while the body streams loses no charge); a call of several stakes
//! is settled once its records are counted.

use super::context::Job;
use super::credits;
use super::flight::{Fetched, Outcome};
use super::org_probe;
use crate::app::App;
use crate::cache::entry::etag_of;
use crate::error::GatewayError;
use crate::ledger::Reservation;
use crate::scheduler::Asker;
use crate::upstream::{retry_after, Failed, Head, UpstreamResponse};
use http::StatusCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// One request's stake in a call: its job (team, member, target), its
/// reservation (credits reserved, not yet spent), and how much of the call
/// it asked for.
pub(super) struct Stake {
    pub(super) job: Job,
    reservation: Option<Reservation>,
    /// Its part of the call: ids for a lookup, 1 for a page.
    asked: u64,
}

/// What [`open`] leads to.
pub(super) enum Opened {
    /// Credits reserved: the purchase may go on (boxed: a stake carries its
    /// job, the refusal only a pointer).
    Staked(Box<Stake>),
    /// The company is out of upstream credits: its last 402, no call.
    OrgExhausted(Arc<Fetched>),
}

/// The org probe, then the reservation of the worst case in every budget
/// the member counts against (refused: a 402 naming the budget).
pub(super) async fn open(app: &Arc<App>, job: &Job, asked: u64) -> Result<Opened, GatewayError> {
    if job.target.route.is_metered() {
        if let Some(refusal) = org_probe::exhausted(app, job) {
            return Ok(Opened::OrgExhausted(refusal));
        }
    }
    let reservation = credits::reserve(app, job).await?;
    Ok(Opened::Staked(Box::new(Stake {
        job: job.clone(),
        reservation,
        asked: asked.max(1),
    })))
}

impl Stake {
    /// The most this stake may be charged: its reservation, or the route's
    /// estimate when the ledger was down and the operator chose to fail open.
    fn reserved(&self) -> u64 {
        credits::reserved(&self.job, self.reservation.as_ref())
    }

    /// Its part of the call, for [`shares`].
    fn part(&self, records: Option<u64>) -> Part {
        Part {
            records: records.unwrap_or(0),
            asked: self.asked,
            reserved: self.reserved(),
        }
    }

    /// The credits given back: nothing was bought for it.
    pub(super) async fn release(self, app: &App) {
        credits::release(app, self.reservation).await;
    }
}

/// A fair turn for `team` at the upstream rate, bounded by
/// `upstream.max_queue_wait_secs` or the client's shorter `wait`
/// (`Prefer: wait`), and refused at once when the gate predicts a longer
/// one (taken after the reservation, so a team out of budget never takes
/// a place in the queue). Refused, the caller releases its stakes.
pub(super) async fn turn(app: &App, asker: Asker<'_>, wait: Option<Duration>) -> Result<(), GatewayError> {
    app.scheduler.acquire(asker, wait).await
}

/// One call's result, its stakes still to settle.
pub(super) struct Called {
    /// The answer as every path takes it ([`checked`]): an error
    /// status became its error; a 200's `credits` are its bill.
    pub(super) outcome: Outcome,
    /// What the upstream billed for the call.
    pub(super) bill: u64,
    stakes: Vec<Stake>,
    /// A lone stake settled from the head: its charge and the settle.
    early: Option<(u64, credits::Settling)>,
}

/// The call of `job`, carrying `stakes` (one for a miss, several for a
/// batch): forwarded, seen by the org's accounting, charged from its head
/// (or its records when the head has no bill) and checked. A lone stake is
/// settled from the head as soon as it shows a bill.
pub(super) async fn call(app: &Arc<App>, job: &Job, mut stakes: Vec<Stake>) -> Called {
    let metered = job.target.route.is_metered();
    let (heads, mut seen) = watch::channel(None);
    let call = upstream_call(app, job, &heads);
    tokio::pin!(call);
    let mut early: Option<(u64, credits::Settling)> = None;
    let result = loop {
        tokio::select! {
            result = &mut call => break result,
            Ok(()) = seen.changed(), if early.is_none() && stakes.len() == 1 => {
                let head = seen.borrow_and_update().clone();
                let Some(head) = head.filter(|h| h.status == StatusCode::OK) else { continue };
                if let Some(bill) = credits::billed(&head.headers) {
                    app.org.observe(head.status, &head.headers, &bytes::Bytes::new(), &app.metrics);
                    early = settle_all(app, job, bill, &mut stakes, None).pop();
                }
            }
        }
    };
    match result {
        Ok(resp) => {
            app.org.observe(resp.status, &resp.headers, &resp.body, &app.metrics);
            let bill = credits::bill(resp.status, &resp.headers, Some(&resp.body), metered);
            let outcome = checked(app, job, resp, answer_credits(bill, &stakes, &early)).await;
            Called {
                outcome,
                bill,
                stakes,
                early,
            }
        }
        Err(failed) => failure(app, job, stakes, early, failed),
    }
}

/// A call without an answer: when the upstream sent a 200 head before the
/// body failed (cut, too large, the deadline), the call may have been
/// billed. A head that carries its bill is settled at it; one that does
/// not (the upstream bills every metered 200 in `X-Credits-Request`) is
/// settled at the reservations and counted as an anomaly: erring towards
/// counting, since the upstream may have billed it. Otherwise nothing was
/// billed and the stakes are released.
fn failure(
    app: &App,
    job: &Job,
    stakes: Vec<Stake>,
    early: Option<(u64, credits::Settling)>,
    failed: Failed,
) -> Called {
    let bill = match (&early, &failed.head) {
        (Some(_), Some(head)) => credits::billed(&head.headers).unwrap_or(0),
        (None, Some(head)) if head.status == StatusCode::OK => {
            app.org
                .observe(head.status, &head.headers, &bytes::Bytes::new(), &app.metrics);
            match credits::billed(&head.headers) {
                Some(bill) => bill,
                None if job.target.route.is_metered() => {
                    let reserved: u64 = stakes.iter().map(Stake::reserved).sum();
                    app.metrics.credit_anomaly(&job.team.name);
                    tracing::warn!(
                        team = %job.team.name,
                        request_id = %job.request_id,
                        reserved,
                        "anomaly: a 200 head without X-Credits-Request whose body failed; settled at the reservation"
                    );
                    reserved
                }
                None => 0,
            }
        }
        _ => 0,
    };
    Called {
        outcome: Err(failed.error.billed_at(answer_credits(bill, &stakes, &early))),
        bill,
        stakes,
        early,
    }
}

/// What the call's answer says it cost: a lone stake's own charge (settled
/// from the head, or its share of the bill), a batch's whole bill (each
/// buyer's share comes with its settle).
fn answer_credits(bill: u64, stakes: &[Stake], early: &Option<(u64, credits::Settling)>) -> u64 {
    match (early, stakes) {
        (Some((charged, _)), _) => *charged,
        (None, [one]) => shares(bill, &[one.part(None)])[0],
        _ => bill,
    }
}

impl Called {
    /// The stakes of a call billed nothing (a 422), handed back whole to
    /// ride another call, with its outcome; `Err(self)` when it was billed
    /// (it settles).
    pub(super) fn unbilled(self) -> Result<(Outcome, Vec<Stake>), Called> {
        if self.bill == 0 && self.early.is_none() {
            Ok((self.outcome, self.stakes))
        } else {
            Err(self)
        }
    }

    /// Settles every stake at its share of the bill ([`shares`]; `records`:
    /// the records each stake got, when they can be counted) or releases
    /// those charged nothing; each stake's charge, in order.
    pub(super) async fn settle(mut self, app: &Arc<App>, records: Option<&[u64]>) -> Vec<u64> {
        if let Some((charged, settling)) = self.early.take() {
            credits::settled_or_late(settling).await;
            return vec![charged];
        }
        let job = match self.stakes.first() {
            Some(stake) => stake.job.clone(),
            None => return Vec::new(),
        };
        let mut charges = Vec::with_capacity(self.stakes.len());
        let mut settling = Vec::with_capacity(self.stakes.len());
        for (charged, task) in settle_all(app, &job, self.bill, &mut self.stakes, records) {
            charges.push(charged);
            settling.push(task);
        }
        for task in settling {
            credits::settled_or_late(task).await;
        }
        charges
    }
}

/// Each stake's share of `bill` ([`shares`]), settled in a task of its own
/// beside the call; what the reservations do not cover logged as an
/// anomaly. Empties `stakes`.
fn settle_all(
    app: &Arc<App>,
    job: &Job,
    bill: u64,
    stakes: &mut Vec<Stake>,
    records: Option<&[u64]>,
) -> Vec<(u64, credits::Settling)> {
    let parts: Vec<Part> = stakes
        .iter()
        .enumerate()
        .map(|(i, h)| h.part(records.and_then(|r| r.get(i).copied())))
        .collect();
    let charges = shares(bill, &parts);
    let charged: u64 = charges.iter().sum();
    if bill > charged {
        app.metrics.credit_anomaly(&job.team.name);
        tracing::warn!(
            team = %job.team.name,
            route = job.target.route.as_str(),
            request_id = %job.request_id,
            billed = bill,
            reserved = parts.iter().map(|p| p.reserved).sum::<u64>(),
            "anomaly: the upstream billed more than the worst case reserved; the rest is untracked"
        );
    }
    stakes
        .drain(..)
        .zip(charges)
        .map(|(stake, charged)| {
            (
                charged,
                credits::settle_beside(app, &stake.job, stake.reservation, charged),
            )
        })
        .collect()
}

/// The upstream call of `job`, each answer's head shown on `heads` as it
/// arrives (before its body).
fn upstream_call<'a>(
    app: &'a App,
    job: &'a Job,
    heads: &'a watch::Sender<Option<Head>>,
) -> impl std::future::Future<Output = Result<UpstreamResponse, Failed>> + 'a {
    app.upstream.fetch_with_heads(
        &job.target,
        &job.request_id,
        &job.trace,
        job.accept.as_ref(),
        &app.metrics,
        heads,
    )
}

/// An answer as every path takes it, once its charge is known (`credits`:
/// what its request pays, or a batch's whole bill): an upstream 429 pauses
/// the scheduler, an error status becomes the error (here, once, for every
/// path), and a 200 that is not JSON is refused with what it billed.
async fn checked(app: &App, job: &Job, resp: UpstreamResponse, credits: u64) -> Outcome {
    let max = Duration::from_secs(app.config.upstream.max_retry_after_secs);
    if resp.status == StatusCode::TOO_MANY_REQUESTS {
        let wait = retry_after(&resp.headers, max).unwrap_or(Duration::from_secs(1));
        app.scheduler.pause(wait).await;
    }
    if let Some(e) = GatewayError::of_upstream_status(resp.status, &resp.headers, max) {
        if e == GatewayError::UpstreamKeyRefused {
            tracing::error!(
                request_id = %job.request_id,
                status = resp.status.as_u16(),
                "upstream refused the gateway's key (upstream.api_key): an upstream failure, not the team's"
            );
        }
        return Err(e);
    }
    if resp.status == StatusCode::OK && !is_json(&resp) {
        // Settled at what its head billed (a cut body is still a bill): the
        // error carries it to the answer and the access line.
        let invalid = GatewayError::UpstreamInvalid("Upstream sent a malformed answer");
        return Err(invalid.billed_at(credits));
    }
    let etag = (resp.status == StatusCode::OK).then(|| etag_of(&resp.body));
    Ok(Arc::new(Fetched {
        status: resp.status,
        bill: credits::billed(&resp.headers),
        headers: resp.headers,
        body: resp.body,
        credits,
        worth: credits,
        from_cache: false,
        etag,
    }))
}

/// A JSON content type and a body that parses: what every 200 of the
/// upstream is. Anything else (a cut body, an HTML error page) is refused.
fn is_json(resp: &UpstreamResponse) -> bool {
    let json_type = resp
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim_start().starts_with("application/json"));
    json_type && serde_json::from_slice::<serde::de::IgnoredAny>(&resp.body).is_ok()
}

/// One request's part of a call, for [`shares`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Part {
    /// The records the call brought for it (0 when they cannot be counted).
    pub(super) records: u64,
    /// What it asked for (its ids; 1 for a page).
    pub(super) asked: u64,
    /// The most it may be charged.
    pub(super) reserved: u64,
}

/// The one rule of who pays what of one call's `bill` (the module doc):
/// records first, then the rest by what each asked, each up to its
/// reservation. The charges sum to `min(bill, Σ reserved)`.
pub(super) fn shares(bill: u64, parts: &[Part]) -> Vec<u64> {
    let own: Vec<(u64, u64)> = parts.iter().map(|p| (p.records, p.records.min(p.reserved))).collect();
    let mut charges = fill(bill, &own);
    let left = bill - charges.iter().sum::<u64>();
    let rest: Vec<(u64, u64)> = parts
        .iter()
        .zip(&charges)
        .map(|(p, c)| (p.asked, p.reserved - c))
        .collect();
    for (c, more) in charges.iter_mut().zip(fill(left, &rest)) {
        *c += more;
    }
    charges
}

/// Splits `amount` in proportion to each `(weight, cap)`'s weight, none
/// above its cap (what a capped one cannot take goes to the others, by
/// their weights), in whole credits: the remainders go to the largest
/// fractions, ties to the larger weight, then to the first. Sums to
/// `min(amount, Σ cap)`.
fn fill(amount: u64, parts: &[(u64, u64)]) -> Vec<u64> {
    let mut out = vec![0u64; parts.len()];
    let mut open: Vec<usize> = (0..parts.len())
        .filter(|i| parts[*i].0 > 0 && parts[*i].1 > 0)
        .collect();
    let mut left = amount;
    while left > 0 && !open.is_empty() {
        let weight: u128 = open.iter().map(|i| u128::from(parts[*i].0)).sum();
        // A part whose proportional share reaches its cap takes its cap,
        // and the rest is shared again among the others.
        let capped: Vec<usize> = open
            .iter()
            .copied()
            .filter(|i| u128::from(left) * u128::from(parts[*i].0) >= u128::from(parts[*i].1 - out[*i]) * weight)
            .collect();
        if !capped.is_empty() {
            for i in &capped {
                left -= parts[*i].1 - out[*i];
                out[*i] = parts[*i].1;
            }
            open.retain(|i| !capped.contains(i));
            continue;
        }
        // No one reaches its cap: whole shares, then the remainders.
        let mut fractions: Vec<(u128, u64, usize)> = Vec::with_capacity(open.len());
        let mut given = 0;
        for i in &open {
            let exact = u128::from(left) * u128::from(parts[*i].0);
            let whole = u64::try_from(exact / weight).unwrap_or(u64::MAX);
            out[*i] += whole;
            given += whole;
            fractions.push((exact % weight, parts[*i].0, *i));
        }
        fractions.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)).then(a.2.cmp(&b.2)));
        for (_, _, i) in fractions
            .into_iter()
            .take(usize::try_from(left - given).unwrap_or(usize::MAX))
        {
            out[i] += 1;
        }
        left = 0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn part(records: u64, asked: u64, reserved: u64) -> Part {
        Part {
            records,
            asked,
            reserved,
        }
    }

    #[test]
    fn a_lone_call_pays_its_bill_up_to_its_reservation() {
        assert_eq!(shares(7, &[part(0, 1, 50)]), vec![7]);
        assert_eq!(shares(3, &[part(1, 3, 3)]), vec![3], "billed 3 for 1 record");
        assert_eq!(shares(5_000_000, &[part(0, 1, 50)]), vec![50], "the rest untracked");
        assert_eq!(shares(0, &[part(2, 3, 3)]), vec![0]);
    }

    #[test]
    fn a_batch_billed_above_its_records_pays_as_each_would_alone() {
        // Three lookups of 3 ids, billed 9 for 1 record: the record's own,
        // then the rest by ids asked, each up to its reservation.
        assert_eq!(shares(9, &[part(1, 3, 3), part(0, 3, 3), part(0, 3, 3)]), vec![3, 3, 3]);
        // Billed 6: one credit the record's, 5 by ids asked (5/3 each: one
        // whole credit each, the two left to the first of equal parts).
        assert_eq!(shares(6, &[part(1, 3, 3), part(0, 3, 3), part(0, 3, 3)]), vec![3, 2, 1]);
    }

    #[test]
    fn a_bill_without_records_is_split_by_what_each_asked_not_by_order() {
        assert_eq!(shares(9, &[part(0, 3, 3), part(0, 4, 4), part(0, 2, 2)]), vec![3, 4, 2]);
        assert_eq!(shares(9, &[part(0, 2, 2), part(0, 3, 3), part(0, 4, 4)]), vec![2, 3, 4]);
        // Half the bill: each pays half of what it asked (4.5 → the larger).
        assert_eq!(shares(4, &[part(0, 2, 2), part(0, 6, 6)]), vec![1, 3]);
    }

    #[test]
    fn a_bill_below_the_records_is_split_by_the_records() {
        assert_eq!(shares(3, &[part(4, 4, 4), part(2, 2, 2)]), vec![2, 1]);
    }

    proptest! {
        #[test]
        fn charges_sum_to_the_bill_as_far_as_reservations_cover_it(
            bill in 0u64..500,
            raw in proptest::collection::vec((0u64..60, 1u64..60, 0u64..60), 1..8),
        ) {
            let parts: Vec<Part> = raw.iter().map(|(r, a, res)| part((*r).min(*a), *a, *res)).collect();
            let charges = shares(bill, &parts);
            let reserved: u64 = parts.iter().map(|p| p.reserved).sum();
            prop_assert_eq!(charges.iter().sum::<u64>(), bill.min(reserved));
            for (c, p) in charges.iter().zip(&parts) {
                prop_assert!(*c <= p.reserved);
            }
            // Order does not matter: the same parts reversed pay the same.
            let mut reversed = parts.clone();
            reversed.reverse();
            let mut back = shares(bill, &reversed);
            back.reverse();
            let differ = charges.iter().zip(&back).filter(|(a, b)| a != b).count();
            // Only a tie between equal parts may go the other way.
            prop_assert!(differ == 0 || parts.iter().zip(&charges).zip(&back).all(|((_, a), b)| a.abs_diff(*b) <= 1));
        }
    }
}
