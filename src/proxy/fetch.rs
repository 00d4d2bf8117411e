//! The miss path (DESIGN §2 steps 8–13): coalesce, fetch upstream, settle,
//! store. The fetch runs in its own task so a client that hangs up cannot
//! cancel it halfway: once the upstream is asked, its answer is accounted
//! for and cached whatever happens to the caller.

use crate::app::App;
use crate::auth::Team;
use crate::cache::entry::etag_of;
use crate::cache::flight::{follow, Join};
use crate::cache::{control, now_ms, Entry};
use crate::error::GatewayError;
use crate::ledger::{Reservation, Reserved};
use crate::route::{self, Target};
use crate::upstream::UpstreamResponse;
use backon::{ExponentialBuilder, Retryable};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::sync::Arc;
use std::time::Duration;

/// What one upstream fetch produced, shared with coalesced followers.
#[derive(Debug)]
pub struct Fetch {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Credits the upstream charged for it (0 when another replica fetched).
    pub credits: u64,
    /// Another replica fetched it; we read its entry from Redis.
    pub from_peer: bool,
    /// The body's ETag on a 200, hashed once for the leader, its followers
    /// and the cache entry alike.
    pub etag: Option<String>,
}

pub type Outcome = Result<Arc<Fetch>, GatewayError>;

/// How this request took part in the fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// It fetched (and its team pays).
    Leader,
    /// Another request's fetch answered it.
    Follower,
}

/// What a fetch needs to know, owned so the fetch can outlive the request.
#[derive(Clone)]
pub struct Job {
    pub team: Arc<Team>,
    pub target: Target,
    /// `None`: not cacheable, no coalescing.
    pub key: Option<String>,
    /// The client said `no-store`.
    pub no_store: bool,
    pub request_id: String,
    pub accept: Option<http::HeaderValue>,
}

impl GatewayError {
    /// Whether followers may take this failure as theirs too: upstream
    /// failures yes; the leader's own budget or rate, no.
    fn shared_with_followers(&self) -> bool {
        matches!(
            self,
            GatewayError::UpstreamTimeout | GatewayError::UpstreamUnavailable | GatewayError::UpstreamInvalid(_)
        )
    }
}

/// One upstream fetch per key at a time in this process; the others wait
/// for it. A follower whose leader failed for its own reasons tries itself.
pub async fn coalesced(app: &Arc<App>, job: Job) -> (Outcome, Role) {
    let Some(key) = job.key.clone() else {
        return (run(app.clone(), job).await, Role::Leader);
    };
    loop {
        match app.flights.join(&key) {
            Join::Leader(leader) => {
                let task = tokio::spawn(run(app.clone(), job.clone()));
                let outcome = task.await.unwrap_or(Err(GatewayError::Internal));
                leader.complete(outcome.clone());
                return (outcome, Role::Leader);
            }
            Join::Follower(rx) => match follow(rx).await {
                Some(Ok(fetch)) => return (Ok(fetch), Role::Follower),
                Some(Err(e)) if e.shared_with_followers() => return (Err(e), Role::Follower),
                _ => continue,
            },
        }
    }
}

/// The leader's work: cross-replica lease, upstream call, store.
async fn run(app: Arc<App>, job: Job) -> Outcome {
    let lease = match (&job.key, app.cache.redis()) {
        (Some(key), Some(_)) => Some(app.cache.lease_key(key)),
        _ => None,
    };
    if let (Some(lease_key), Some(key)) = (&lease, &job.key) {
        if !acquire_lease(&app, lease_key).await {
            if let Some(entry) = wait_for_peer(&app, &job, key, lease_key).await {
                return Ok(Arc::new(Fetch {
                    status: StatusCode::OK,
                    headers: HeaderMap::new(),
                    body: entry.body.clone(),
                    credits: entry.credits,
                    from_peer: true,
                    etag: Some(entry.etag.clone()),
                }));
            }
        }
    }
    let outcome = fetch_upstream(&app, &job).await;
    if let Some(lease_key) = lease {
        release_lease(&app, lease_key).await;
    }
    outcome
}

async fn fetch_upstream(app: &Arc<App>, job: &Job) -> Outcome {
    let metered = job.target.route.is_metered();
    if metered {
        if let Some((headers, body)) = app.org.exhausted() {
            app.metrics
                .upstream_exhausted_total
                .with_label_values(&[&job.team.name])
                .inc();
            probe_org_usage(app, job);
            return Ok(Arc::new(Fetch {
                status: StatusCode::PAYMENT_REQUIRED,
                headers,
                body,
                credits: 0,
                from_peer: false,
                etag: None,
            }));
        }
    }
    // 9. Reserve the worst case, or refuse before anything is spent.
    let reservation = reserve(app, job).await?;
    // 10. Wait for this team's fair turn at the upstream rate.
    if let Err(e) = app.scheduler.acquire(&job.team.name).await {
        release(app, reservation).await;
        return Err(e);
    }
    // 11. Forward.
    let resp = match app
        .upstream
        .fetch(&job.target, &job.request_id, job.accept.as_ref(), &app.metrics)
        .await
    {
        Ok(resp) => resp,
        Err(e) => {
            release(app, reservation).await;
            return Err(e);
        }
    };
    app.org.observe(&resp, &app.metrics);
    if resp.status == StatusCode::TOO_MANY_REQUESTS {
        let wait = crate::upstream::retry_after(&resp.headers).unwrap_or(Duration::from_secs(1));
        app.scheduler.pause(wait).await;
    }
    // 12. Settle to what the upstream charged, even for an answer we cannot
    //     pass on: the upstream billed it all the same.
    let credits = super::answer::credits_charged(&resp, metered);
    settle(app, job, reservation, credits).await;
    if resp.status == StatusCode::OK && !is_json(&resp) {
        return Err(GatewayError::UpstreamInvalid("Upstream sent a malformed answer"));
    }
    let etag = (resp.status == StatusCode::OK).then(|| etag_of(&resp.body));
    // 13. Store.
    if let (Some(key), Some(etag)) = (&job.key, &etag) {
        maybe_store(app, job, key, &resp, etag, credits).await;
    }
    Ok(Arc::new(Fetch {
        status: resp.status,
        headers: resp.headers,
        body: resp.body,
        credits,
        from_peer: false,
        etag,
    }))
}

async fn reserve(app: &App, job: &Job) -> Result<Option<Reservation>, GatewayError> {
    let team = &job.team;
    let amount = route::credit_estimate(&job.target);
    // Free calls cannot overspend: they are recorded, never refused.
    let limit = if amount == 0 { None } else { team.credit_limit };
    match app.ledger.reserve(&team.name, limit, amount).await {
        Ok(Reserved::Granted(r)) => Ok(Some(r)),
        Ok(Reserved::Rejected { limit, .. }) => {
            app.metrics
                .quota_rejections_total
                .with_label_values(&[&team.name])
                .inc();
            Err(GatewayError::QuotaExceeded {
                limit,
                upgrade_url: app.config.quota.upgrade_url.clone(),
            })
        }
        Err(e) => {
            app.metrics
                .backend_errors_total
                .with_label_values(&["ledger", "reserve"])
                .inc();
            tracing::error!(team = %team.name, error = %e, "ledger reserve failed");
            // A free call has nothing to budget; a metered one fails closed
            // unless the operator chose otherwise.
            if amount == 0 || app.config.quota.fail_open {
                Ok(None)
            } else {
                Err(GatewayError::Unavailable("Credit ledger unavailable"))
            }
        }
    }
}

async fn release(app: &App, reservation: Option<Reservation>) {
    if let Some(r) = reservation {
        app.ledger.release(r).await;
    }
}

async fn settle(app: &App, job: &Job, reservation: Option<Reservation>, credits: u64) {
    let route = job.target.route;
    if credits > 0 {
        app.metrics
            .credits_spent_total
            .with_label_values(&[&job.team.name, route.as_str()])
            .inc_by(credits);
    }
    let Some(r) = reservation else { return };
    if let Err(e) = app.ledger.settle(r, credits, route).await {
        app.metrics
            .backend_errors_total
            .with_label_values(&["ledger", "settle"])
            .inc();
        tracing::error!(team = %job.team.name, credits, error = %e, "ledger settle failed");
    }
}

/// While the org is out of credits, ask the upstream's own /v2/usage now and
/// then whether credits came back (free: usage costs nothing).
fn probe_org_usage(app: &Arc<App>, job: &Job) {
    if !app.org.probe_due() {
        return;
    }
    let app = app.clone();
    let request_id = job.request_id.clone();
    tokio::spawn(async move {
        let target = Target {
            route: route::Route::Usage,
            path: "/v2/usage".into(),
            query: None,
        };
        let Ok(resp) = app.upstream.fetch(&target, &request_id, None, &app.metrics).await else {
            return;
        };
        let over = serde_json::from_slice::<serde_json::Value>(&resp.body)
            .ok()
            .and_then(|v| v.get("is_over_limit").and_then(serde_json::Value::as_bool));
        if resp.status == StatusCode::OK && over == Some(false) {
            app.org.recovered();
        }
    });
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

/// Stores 200 answers (already checked to be JSON) under the size cap,
/// unless the client said `no-store` or the upstream `no-store`/`private`.
async fn maybe_store(app: &App, job: &Job, key: &str, resp: &UpstreamResponse, etag: &str, credits: u64) {
    let Some(ttl) = app.cache.ttl(job.target.route) else {
        return;
    };
    let storable = resp.status == StatusCode::OK
        && !job.no_store
        && !control::forbids_storing(&resp.headers)
        && resp.body.len() <= app.cache.max_entry_bytes;
    if storable {
        let entry = Entry::with_etag(resp.body.clone(), etag.to_string(), credits, ttl, job.target.route);
        app.cache.store(key, Arc::new(entry)).await;
    }
}

/// SET NX PX: true when this replica should fetch. A Redis that does not
/// answer means no lease: fetch ourselves rather than wait.
async fn acquire_lease(app: &App, lease_key: &str) -> bool {
    let Some(redis) = app.cache.redis() else {
        return true;
    };
    let ttl_ms = (app.config.upstream.timeout_secs * 1000 + 1000).max(1000);
    let key = lease_key.to_string();
    let got: Result<Option<String>, _> = redis
        .call("lease", |mut c| async move {
            redis::cmd("SET")
                .arg(&key)
                .arg(1)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut c)
                .await
        })
        .await;
    !matches!(got, Ok(None))
}

async fn release_lease(app: &App, lease_key: String) {
    if let Some(redis) = app.cache.redis() {
        let _ = redis
            .call("lease", |mut c| async move {
                redis::cmd("DEL").arg(&lease_key).query_async::<u64>(&mut c).await
            })
            .await;
    }
}

/// Another replica holds the lease: poll its L2 entry (backing off from 5
/// to 50 ms) until it appears, the lease goes away without one, or
/// `cache.coalesce_wait_ms` passes.
async fn wait_for_peer(app: &App, job: &Job, key: &str, lease_key: &str) -> Option<Entry> {
    let redis = app.cache.redis()?;
    let route = job.target.route;
    let poll = || async {
        if let Some(entry) = app
            .cache
            .lookup_redis(route, key)
            .await
            .filter(|e| e.is_fresh(now_ms()))
        {
            return Ok(Some(entry));
        }
        let lk = lease_key.to_string();
        let held: Result<u64, _> = redis
            .call("lease", |mut c| async move {
                redis::cmd("EXISTS").arg(&lk).query_async(&mut c).await
            })
            .await;
        match held {
            Ok(1) => Err(PeerPending),
            // Released without an entry (a failed fetch), or Redis is gone.
            _ => Ok(None),
        }
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(5))
        .with_max_delay(Duration::from_millis(50))
        .with_max_times(usize::MAX)
        .with_total_delay(Some(Duration::from_millis(app.config.cache.coalesce_wait_ms)));
    poll.retry(backoff).await.ok().flatten()
}

/// The peer's fetch is still running.
#[derive(Debug)]
struct PeerPending;
