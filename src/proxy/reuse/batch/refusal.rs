//! A batch the upstream refused for some of its ids (422): the buyers it
//! names get the upstream's refusal of their own lists and their credits
//! back, the others go again together; a refusal that names no id of the
//! list leaves each buyer to ask alone.

use super::call::Source;
use super::queue::{Buyer, Order, Share};
use crate::app::App;
use crate::cache::records::IdList;
use crate::proxy::context::Job;
use crate::proxy::fetch;
use crate::proxy::flight::{Fetched, Outcome};
use crate::proxy::purchase::Stake;
use crate::proxy::reuse::kind::{Got, Kind};
use crate::proxy::reuse::learn::learn;
use http::StatusCode;
use std::sync::Arc;

/// A batch the upstream refused (422, billed nothing) for some buyers'
/// ids: each of those gets the upstream's refusal of its own ids, at
/// their places in its own request (kept, so the page path answers it
/// without a call), and its credits back; the others go again together in
/// the next call, their stakes whole (returned, for the caller to queue
/// again). A refusal that names no id of the list (or names every buyer)
/// leaves each buyer to ask alone.
pub(super) async fn refused(
    app: &Arc<App>,
    (outcome, at): (Outcome, &[Vec<Source>]),
    stakes: Vec<Stake>,
    orders: Vec<(Job, Order)>,
) -> Vec<Buyer> {
    let refusals = match &outcome {
        Ok(f) => offenders(&f.body, at, &orders),
        Err(_) => None,
    };
    let Some(refusals) = refusals.filter(|r| r.iter().any(Option::is_none)) else {
        for (stake, (job, order)) in stakes.into_iter().zip(orders) {
            stake.release(app).await;
            app.detach(alone(app.clone(), job, order));
        }
        return Vec::new();
    };
    let headers = outcome.as_ref().map(|f| f.headers.clone()).unwrap_or_default();
    let mut again = Vec::new();
    for ((stake, (_, order)), refusal) in stakes.into_iter().zip(orders).zip(refusals) {
        let Some(body) = refusal else {
            again.push(Buyer { stake, order });
            continue;
        };
        stake.release(app).await;
        let content_type = headers.get(http::header::CONTENT_TYPE).cloned();
        if let Some(key) = &order.request_key {
            app.cache.refusals.keep(key, body.clone(), content_type);
        }
        let refusal = Arc::new(Fetched {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            headers: headers.clone(),
            body,
            credits: 0,
            bill: Some(0),
            worth: 0,
            from_cache: false,
            etag: None,
        });
        let n = order.wanted.len();
        let _ = order.done.send(Share {
            got: vec![Ok(Got::Refused(refusal)); n],
            charged: 0,
        });
    }
    again
}

/// Which buyers the upstream's 422 refuses: for each, the refusal of its
/// own ids as the upstream would write it for its request as sent (each
/// `loc` index moved from the batch's list to the request's), or `None`
/// for a buyer it does not name. `None` when an error of the body is not
/// about an id of the list.
fn offenders(body: &[u8], at: &[Vec<Source>], orders: &[(Job, Order)]) -> Option<Vec<Option<bytes::Bytes>>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let mut mine: Vec<Vec<serde_json::Value>> = vec![Vec::new(); orders.len()];
    for error in v.get("detail")?.as_array()? {
        let loc = error.get("loc")?.as_array()?;
        let k = match loc.as_slice() {
            [q, id, k] if q == "query" && id == "id" => usize::try_from(k.as_u64()?).ok()?,
            _ => return None,
        };
        let (b, j) = at
            .iter()
            .enumerate()
            .find_map(|(b, from)| from.iter().position(|s| s.asked() == Some(k)).map(|j| (b, j)))?;
        let mut error = error.clone();
        error["loc"][2] = serde_json::json!(orders[b].1.wanted[j]);
        mine[b].push(error);
    }
    Some(
        mine.into_iter()
            .map(|errors| {
                (!errors.is_empty()).then(|| {
                    let body = serde_json::json!({ "detail": errors });
                    bytes::Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
                })
            })
            .collect(),
    )
}

/// A buyer's ids asked alone, after a batch they shared was refused and
/// the refusal could not be told apart: a purchase of its own, in its own
/// call.
async fn alone(app: Arc<App>, mut job: Job, order: Order) {
    let Order { list, wanted, done, .. } = order;
    let all: Vec<usize> = (0..wanted.len()).collect();
    let Some(target) = list.call(&wanted, 0) else {
        return;
    };
    job.target = target;
    let outcome = fetch::uncoalesced(&app, job.clone()).await;
    let charged = fetch::charged(&outcome, fetch::Role::Leader);
    let list = IdList {
        ids: wanted.iter().map(|i| list.ids[*i].clone()).collect(),
        keys: wanted.iter().map(|i| list.keys[*i].clone()).collect(),
        ..list
    };
    let got = learn(&app, &list, &all, &job, outcome).await;
    let _ = done.send(Share { got, charged });
}
