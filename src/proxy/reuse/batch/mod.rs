//! Id lookups of many requests share one upstream call: the org's ~120
//! calls a minute go further when a call carries every id that waits for
//! one (the by-id operations take up to 50, and the upstream bills per
//! record, not per call).
//!
//! A request's buyer (`per_piece`) that leads some ids reserves for them in
//! its own team's budget (refused: a 402 for its ids alone, nothing about
//! the others changes), then joins its route's queue. The first to join an
//! idle queue drives it: the next call gathers company first, as long as
//! the rate in hand says (**Time**, below); then each team with ids waiting
//! takes its own fair turn at the upstream rate, and the first turn to
//! come takes up to 50 ids, that team's first, then round-robin over the
//! others (a team flooding lookups cannot push another's ids out of the
//! next batch, nor make them wait its own line), and sends them in one
//! call; ids that did not fit wait for the next turn. While turns are
//! waited for, every id that arrives joins. As the call leaves, its ids
//! are looked up in the cache tiers once more (a search may have brought
//! them meanwhile): those held are answered from there and not asked, and
//! a buyer whose ids are all held leaves the call, its credits released
//! (`call`).
//!
//! **Money.** A buyer is a purchase's stake (`purchase`): its ids' credits
//! reserved in its own budgets before it joins. The batch's call settles
//! every stake by the purchase's one rule: each buyer pays the records of
//! its own ids, and what the bill holds beyond the records (or a bill with
//! no records to count) is split by the ids each asked, up to each
//! reservation; so a lookup costs the same alone and in a batch, and only
//! what no reservation covers is left untracked. Ids answered from the
//! cache as the call left cost nothing (the split of a bill beyond the
//! records still weighs the ids the buyer joined with).
//!
//! **Failure.** A refused turn or a failed call reaches every buyer of the
//! batch as the error a lone lookup would have got; an answer is read and
//! filed once, by the same rules as a lone one (`learn`), and each buyer
//! takes what it says of its own ids. A 422 (an id the upstream refuses)
//! is no buyer's but the one whose id it was: that buyer gets the
//! upstream's refusal of its own list, the others go again together
//! (`refusal`).
//!
//! **Time.** Calls leave full when calls are scarce, at once when they are
//! plentiful (issue 58; `gather` has the rule and its reasons). Before its
//! turns are asked, the next call gathers: until it holds 50 ids or one
//! interval of the gate's steady pace has passed (0.5 s at 120 calls a
//! minute) when ids arrive as a crowd (enough to fill half a call in an
//! interval) or the gate says calls are scarce; for
//! `upstream.batch_window_ms` when the route had a call in the last second;
//! not at all otherwise (a lone lookup on an idle gateway goes at once).
//! Every id that joins wakes it, so a call that fills leaves at once.
//! Every buyer has a deadline (`upstream.max_queue_wait_secs` after it
//! joined, or the client's shorter `Prefer: wait`): no gathering lasts
//! past one interval before the earliest, and a buyer no call took by then
//! gets a 429; ids nobody waits for leave uncalled.
//!
//! Layout: `queue` (the queues, their buyers and what a call takes),
//! `gather` (how long a call waits for company, and the arrival rate it
//! reads), `call` (what a leaving call asks, after the cache tiers),
//! `refusal` (a batch refused for some buyers' ids); this file buys,
//! drives and sends.

use super::kind::{Got, Kind, PieceOutcome};
use super::learn::learn;
use crate::app::App;
use crate::cache::records::IdList;
use crate::error::GatewayError;
use crate::proxy::context::Job;
use crate::proxy::flight::Outcome;
use crate::proxy::purchase::{self, Opened};
use crate::route::Route;
use crate::scheduler::Asker;
use http::StatusCode;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, Notify};
use tokio::task::{AbortHandle, JoinSet};

mod call;
mod gather;
mod queue;
mod refusal;

use call::Source;
use gather::Pace;
pub(crate) use queue::Batches;
use queue::{now, Buyer, Left, Order};
pub(super) use queue::{Share, Waited};

/// Buys `wanted` of `list` in its route's next call, while `waited` says
/// someone waits for them; what the call said of each and what it cost
/// this request's team.
pub(super) async fn buy(
    app: &Arc<App>,
    batches: &Batches,
    job: &Job,
    (list, wanted): (&IdList, &[usize]),
    waited: Waited,
) -> Share {
    let n = wanted.len();
    let Some(target) = list.call(wanted, 0) else {
        return Share::failed(n, GatewayError::Internal);
    };
    let mut job = job.clone();
    job.target = target;
    // Not a page key: the answer is filed piece by piece.
    let request_key = job.key.take();
    // Its own ids, in its own budget, before it joins anyone.
    let stake = match purchase::open(app, &job, n as u64).await {
        Ok(Opened::Staked(stake)) => *stake,
        Ok(Opened::OrgExhausted(refusal)) => {
            return Share {
                got: vec![Ok(Got::Refused(refusal)); n],
                charged: 0,
            }
        }
        Err(e) => return Share::failed(n, e),
    };
    let route = job.target.route;
    let (done, share) = oneshot::channel();
    // The gate's bound, or the client's shorter `Prefer: wait`.
    let max_wait = Duration::from_secs(app.config.upstream.max_queue_wait_secs);
    let max_wait = job.wait.map_or(max_wait, |w| w.min(max_wait));
    let buyer = Buyer {
        stake,
        order: Order {
            list: list.clone(),
            wanted: wanted.to_vec(),
            request_key,
            waited,
            deadline: now() + max_wait,
            done,
        },
    };
    if batches.join(route, buyer) {
        app.detach(driver(app.clone(), batches.clone(), route));
    }
    // The driver runs detached: it only goes away without answering if it
    // panicked.
    share.await.unwrap_or_else(|_| Share::failed(n, GatewayError::Internal))
}

/// [`drive`], as a future of a type that can be named: a driver's call may
/// start the next driver (a refused batch's buyers, queued again).
fn driver(app: Arc<App>, batches: Batches, route: Route) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
    Box::pin(drive(app, batches, route))
}

/// Sends the route's batches while buyers wait. Each team with ids
/// waiting takes its own fair turn at the upstream rate (a light team's
/// lookups wait what its own share implies, not the heaviest team's
/// line); the first turn to come sends a call that carries that team's
/// ids first, then the others' round-robin (each send in a task of its
/// own). A team whose ids all left gives its place back. Before a call,
/// buyers nobody waits for leave without one, and those whose deadline
/// came leave with a 429; turns are waited for only until the earliest
/// deadline. With no turn waited for, the next call gathers first
/// (`gather`).
async fn drive(app: Arc<App>, batches: Batches, route: Route) {
    let mut turns: JoinSet<(String, Result<(), GatewayError>)> = JoinSet::new();
    let mut pending: HashMap<String, AbortHandle> = HashMap::new();
    let joined = batches.joined(route);
    loop {
        if pending.is_empty() {
            gather(&app, &batches, route, &joined).await;
        }
        withdraw(&app, route, batches.leaving(route, now())).await;
        let Some((teams, earliest)) = batches.teams(route) else {
            return;
        };
        // A place in the gate for each team waiting, none for a team gone.
        pending.retain(|name, turn| {
            let waits = teams.iter().any(|(t, _)| t.name == *name);
            if !waits {
                turn.abort();
            }
            waits
        });
        for (team, bulk) in teams {
            if !pending.contains_key(&team.name) {
                let app = app.clone();
                let name = team.name.clone();
                let turn = turns.spawn(async move {
                    let turn = purchase::turn(&app, Asker::of(&team, bulk), None).await;
                    (team.name.clone(), turn)
                });
                pending.insert(name, turn);
            }
        }
        let done = tokio::select! {
            done = turns.join_next() => done,
            // A buyer joined: its team takes a turn of its own now.
            () = joined.notified() => continue,
            // A deadline comes first: its buyer leaves, and the turns
            // still waited for keep their places.
            () = tokio::time::sleep_until(earliest.into()) => continue,
        };
        // A turn given back (its team gone) ends as cancelled: look again.
        let Some(Ok((team, turn))) = done else { continue };
        pending.remove(&team);
        match turn {
            Ok(()) => {
                // Who left while the turn was waited for goes without a call.
                withdraw(&app, route, batches.leaving(route, now())).await;
                let taken = batches.take(route, &team);
                if !taken.is_empty() {
                    app.detach(send(app.clone(), batches.clone(), taken));
                }
            }
            Err(e) => {
                for buyer in batches.take_team(route, &team) {
                    buyer.stake.release(&app).await;
                    let _ = buyer
                        .order
                        .done
                        .send(Share::failed(buyer.order.wanted.len(), e.clone()));
                }
            }
        }
    }
}

/// Holds the route's next call while the gathering rule says it waits for
/// company (`gather`), before any turn is asked (a turn granted is not
/// held); every id that joins wakes it, so a call that fills leaves at
/// once, and a crowd seen meanwhile makes it wait for a full call.
async fn gather(app: &App, batches: &Batches, route: Route, joined: &Notify) {
    let started = now();
    let window = Duration::from_millis(app.config.upstream.batch_window_ms);
    loop {
        let pace = Pace {
            window,
            interval: app.scheduler.interval(),
            scarce: app.scheduler.scarce(),
        };
        let Some(until) = batches.gathering(route, started, pace) else {
            return;
        };
        tokio::select! {
            () = tokio::time::sleep_until(until.into()) => return,
            () = joined.notified() => {}
        }
    }
}

/// Buyers out of the queue before any call: their credits released, each
/// counted; one whose deadline came is refused (429) with the wait the
/// gate predicts for its team.
async fn withdraw(app: &App, route: Route, gone: Vec<(Buyer, Left)>) {
    for (buyer, why) in gone {
        app.metrics.upstream_withdrawn(route, why.as_str());
        let team = buyer.stake.job.team.clone();
        let bulk = buyer.stake.job.member.bulk;
        buyer.stake.release(app).await;
        if why == Left::Deadline {
            let wait = app.scheduler.predicted_wait(Asker::of(&team, bulk));
            let refused = GatewayError::UpstreamRateLimited {
                retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
                why: crate::error::GateRefusal::Deadline,
            };
            let _ = buyer.order.done.send(Share::failed(buyer.order.wanted.len(), refused));
        }
    }
}

/// One call for the buyers' ids that the cache tiers do not hold by now
/// (`call::leaving`: a buyer whose ids are all held is answered from them);
/// each buyer's share of what it said and of its bill (`purchase::shares`:
/// its records, then the rest by the ids it asked).
async fn send(app: Arc<App>, batches: Batches, buyers: Vec<Buyer>) {
    let route = buyers[0].stake.job.target.route;
    let Some((buyers, at, list)) = call::leaving(&app, buyers).await else {
        return;
    };
    let mut job = buyers[0].stake.job.clone();
    app.metrics.upstream_batch(route, list.ids.len(), buyers.len());
    let all: Vec<usize> = (0..list.ids.len()).collect();
    let Some(target) = list.call(&all, 0) else { return };
    job.target = target;
    let mut stakes = Vec::with_capacity(buyers.len());
    let mut orders = Vec::with_capacity(buyers.len());
    for b in buyers {
        orders.push((b.stake.job.clone(), b.order));
        stakes.push(b.stake);
    }
    let called = purchase::call(&app, &job, stakes).await;
    let called = if orders.len() > 1 && refused_id(&called.outcome) {
        match called.unbilled() {
            Ok((outcome, stakes)) => {
                // The buyers the refusal does not name go again together.
                let again = refusal::refused(&app, (outcome, &at), stakes, orders).await;
                if batches.requeue(route, again) {
                    app.detach(driver(app.clone(), batches.clone(), route));
                }
                return;
            }
            Err(billed) => billed,
        }
    } else {
        called
    };
    let got = learn(&app, &list, &all, &job, called.outcome.clone()).await;
    // Each buyer pays the records the call brought it, not those held.
    let records: Vec<u64> = at
        .iter()
        .map(|from| {
            from.iter()
                .filter_map(Source::asked)
                .filter(|i| is_record(&got[*i]))
                .count() as u64
        })
        .collect();
    let counted = records.iter().any(|r| *r > 0);
    let charges = called.settle(&app, counted.then_some(records.as_slice())).await;
    for (((_, order), from), charged) in orders.into_iter().zip(at).zip(charges) {
        let got = from.iter().map(|s| s.outcome(&got)).collect();
        let _ = order.done.send(Share { got, charged });
    }
}

/// Whether a piece came back as a record (one credit).
fn is_record(got: &PieceOutcome) -> bool {
    matches!(got, Ok(Got::Held(e)) if !e.body.is_empty())
}

/// Whether the call's answer is the upstream's 422 for an id of the list.
fn refused_id(outcome: &Outcome) -> bool {
    matches!(outcome, Ok(f) if f.status == StatusCode::UNPROCESSABLE_ENTITY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::flight::Fetched;

    fn fetched_ok(body: &'static str) -> Fetched {
        Fetched {
            status: StatusCode::OK,
            headers: http::HeaderMap::new(),
            body: bytes::Bytes::from_static(body.as_bytes()),
            credits: 0,
            bill: None,
            worth: 0,
            from_cache: false,
            etag: None,
        }
    }

    #[test]
    fn a_422_refuses_an_id_and_nothing_else_does() {
        let mut refused = fetched_ok("{}");
        refused.status = StatusCode::UNPROCESSABLE_ENTITY;
        assert!(refused_id(&Ok(Arc::new(refused))));
        assert!(!refused_id(&Ok(Arc::new(fetched_ok("{}")))));
        assert!(!refused_id(&Err(GatewayError::UpstreamTimeout)));
    }
}
