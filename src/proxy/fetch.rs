//! The miss path (DESIGN §2 steps 8–13): coalesce, fetch upstream, settle,
//! store. The fetch runs in its own task so a client that hangs up cannot
//! cancel it halfway: once the upstream is asked, its answer is accounted
//! for and cached whatever happens to the caller.

use crate::app::App;
use crate::auth::Team;
use crate::cache::flight::{follow, Join};
use crate::cache::{control, now_ms, Entry};
use crate::error::GatewayError;
use crate::route::Target;
use crate::upstream::UpstreamResponse;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::sync::Arc;
use backon::{ExponentialBuilder, Retryable};
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
        matches!(self, GatewayError::UpstreamTimeout | GatewayError::UpstreamUnavailable | GatewayError::UpstreamInvalid(_))
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
    let resp = app
        .upstream
        .fetch(&job.target, &job.request_id, job.accept.as_ref(), &app.metrics)
        .await?;
    let credits = super::answer::credits_charged(&resp, job.target.route.is_metered());
    if credits > 0 {
        app.metrics
            .credits_spent_total
            .with_label_values(&[&job.team.name, job.target.route.as_str()])
            .inc_by(credits);
    }
    if let Some(key) = &job.key {
        maybe_store(app, job, key, &resp, credits).await;
    }
    Ok(Arc::new(Fetch { status: resp.status, headers: resp.headers, body: resp.body, credits, from_peer: false }))
}

/// Stores 200 JSON answers under the size cap, unless the client said
/// `no-store` or the upstream said `no-store`/`private`.
async fn maybe_store(app: &App, job: &Job, key: &str, resp: &UpstreamResponse, credits: u64) {
    let Some(ttl) = app.cache.ttl(job.target.route) else { return };
    let json = resp
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.trim_start().starts_with("application/json"));
    let storable = resp.status == StatusCode::OK
        && json
        && !job.no_store
        && !control::forbids_storing(&resp.headers)
        && resp.body.len() <= app.cache.max_entry_bytes
        && serde_json::from_slice::<serde::de::IgnoredAny>(&resp.body).is_ok();
    if storable {
        let entry = Entry::new(resp.body.clone(), credits, ttl, job.target.route);
        app.cache.store(key, Arc::new(entry)).await;
    }
}

/// SET NX PX: true when this replica should fetch. A Redis that does not
/// answer means no lease: fetch ourselves rather than wait.
async fn acquire_lease(app: &App, lease_key: &str) -> bool {
    let Some(redis) = app.cache.redis() else { return true };
    let ttl_ms = (app.config.upstream.timeout_secs * 1000 + 1000).max(1000);
    let key = lease_key.to_string();
    let got: Result<Option<String>, _> = redis
        .call("lease", |mut c| async move {
            redis::cmd("SET").arg(&key).arg(1).arg("NX").arg("PX").arg(ttl_ms).query_async(&mut c).await
        })
        .await;
    !matches!(got, Ok(None))
}

async fn release_lease(app: &App, lease_key: String) {
    if let Some(redis) = app.cache.redis() {
        let _ = redis
            .call("lease", |mut c| async move { redis::cmd("DEL").arg(&lease_key).query_async::<u64>(&mut c).await })
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
        if let Some(entry) = app.cache.lookup_redis(route, key).await.filter(|e| e.is_fresh(now_ms())) {
            return Ok(Some(entry));
        }
        let lk = lease_key.to_string();
        let held: Result<u64, _> = redis
            .call("lease", |mut c| async move { redis::cmd("EXISTS").arg(&lk).query_async(&mut c).await })
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
