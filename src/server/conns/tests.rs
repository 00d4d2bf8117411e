//! The registry's choices: who makes room, who waits, who is refused.

use super::*;

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

#[tokio::test]
async fn at_the_limit_the_oldest_idle_connection_makes_room() {
    let conns = Conns::new(2, 10);
    let first = conns.admit(LOCAL).await.expect("admitted");
    let busy = conns.admit(LOCAL).await.expect("admitted");
    let _request = first.conn().begin(false);
    let mut busy_orders = busy.conn().orders();
    let mut first_orders = first.conn().orders();
    let admitting = tokio::spawn({
        let conns = conns.clone();
        async move { conns.admit(LOCAL).await.expect("admitted") }
    });
    // `busy` has nothing in flight (despite its name): it is the idle one.
    busy_orders.changed().await.expect("ordered");
    assert_eq!(*busy_orders.borrow(), Order::Evict);
    assert_eq!(*first_orders.borrow_and_update(), Order::Serve, "in flight: kept");
    drop(busy);
    let third = tokio::time::timeout(Duration::from_secs(5), admitting)
        .await
        .expect("admitted once the victim closed")
        .expect("task");
    assert_eq!(conns.lock().by_id.len(), 2);
    drop(third);
}

#[tokio::test]
async fn connections_that_never_sent_a_head_are_evicted_before_idle_keep_alive_ones() {
    let conns = Conns::new(2, 10);
    let kept_alive = conns.admit(LOCAL).await.expect("admitted");
    kept_alive.conn().mark_teamed("a");
    drop(kept_alive.conn().begin(false));
    let silent = conns.admit(LOCAL).await.expect("admitted");
    let admitting = tokio::spawn({
        let conns = conns.clone();
        async move { conns.admit(LOCAL).await.expect("admitted") }
    });
    let mut orders = silent.conn().orders();
    tokio::time::timeout(Duration::from_secs(5), orders.wait_for(|o| *o == Order::Evict))
        .await
        .expect("the silent one evicted")
        .expect("sender alive");
    assert_eq!(
        *kept_alive.conn().orders().borrow(),
        Order::Serve,
        "older but it has served"
    );
    drop(silent);
    let _third = tokio::time::timeout(Duration::from_secs(5), admitting)
        .await
        .expect("admitted")
        .expect("task");
}

#[tokio::test]
async fn a_newcomer_waits_while_every_connection_is_busy() {
    let conns = Conns::new(1, 10);
    let only = conns.admit(LOCAL).await.expect("admitted");
    let request = only.conn().begin(false);
    let refused = tokio::time::timeout(Duration::from_millis(100), conns.admit(LOCAL)).await;
    assert!(refused.is_err(), "admitted past the limit");
    assert_eq!(
        *only.conn().orders().borrow(),
        Order::Serve,
        "a busy connection is kept"
    );
    let waiting = tokio::spawn({
        let conns = conns.clone();
        async move { conns.admit(LOCAL).await.expect("admitted") }
    });
    // The request ends: now the connection is idle and gives its place.
    drop(request);
    let mut orders = only.conn().orders();
    tokio::time::timeout(Duration::from_secs(5), orders.wait_for(|o| *o == Order::Evict))
        .await
        .expect("evicted once idle")
        .expect("sender alive");
    drop(only);
    let _admitted = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("admitted")
        .expect("task");
}

/// Admits a newcomer at a full registry in a task; returns it.
fn admitting(conns: &Arc<Conns>, peer: IpAddr) -> tokio::task::JoinHandle<Option<Slot>> {
    let conns = conns.clone();
    tokio::spawn(async move { conns.admit(peer).await })
}

async fn closed(slot: &Slot) {
    let mut orders = slot.conn().orders();
    tokio::time::timeout(Duration::from_secs(5), orders.wait_for(|o| *o == Order::Evict))
        .await
        .expect("ordered closed")
        .expect("sender alive");
}

#[tokio::test]
async fn an_anonymous_connection_that_was_answered_goes_before_a_fresh_one_and_teams_go_last() {
    let conns = Conns::new(3, 10);
    let team = conns.admit(LOCAL).await.expect("admitted");
    team.conn().mark_teamed("a");
    drop(team.conn().begin(false));
    let fresh = conns.admit(LOCAL).await.expect("admitted");
    let churner = conns.admit(LOCAL).await.expect("admitted");
    drop(churner.conn().begin(false));
    let next = admitting(&conns, LOCAL);
    closed(&churner).await;
    assert_eq!(
        *fresh.conn().orders().borrow(),
        Order::Serve,
        "still reading its first head"
    );
    assert_eq!(*team.conn().orders().borrow(), Order::Serve, "a team's");
    drop(churner);
    let _next = next.await.expect("task").expect("admitted");
    // No anonymous answered one left: the fresh one (oldest such) goes
    // before the team's.
    let last = admitting(&conns, LOCAL);
    closed(&fresh).await;
    assert_eq!(*team.conn().orders().borrow(), Order::Serve);
    drop(fresh);
    let _last = last.await.expect("task").expect("admitted");
}

#[tokio::test]
async fn a_download_in_progress_is_never_evicted() {
    let conns = Conns::new(1, 10);
    let only = conns.admit(LOCAL).await.expect("admitted");
    // As `body.rs` does: the request's guard stays with the answer.
    let sending = (only.conn().begin(false), only.conn().sending());
    let refused = tokio::time::timeout(Duration::from_millis(100), conns.admit(LOCAL)).await;
    assert!(
        refused.is_err(),
        "admitted past the limit while an answer was being sent"
    );
    assert_eq!(*only.conn().orders().borrow(), Order::Serve);
    assert!(only.conn().stalled_for().is_some());
    drop(sending);
    assert!(only.conn().stalled_for().is_none());
}

#[tokio::test]
async fn one_peer_beyond_its_limit_displaces_its_own_connections_or_is_refused() {
    let other: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
    let conns = Conns::new(10, 2);
    let theirs = conns.admit(other).await.expect("admitted");
    let first = conns.admit(LOCAL).await.expect("admitted");
    let second = conns.admit(LOCAL).await.expect("admitted");
    let busy = (first.conn().begin(false), second.conn().begin(false));
    // Both busy: the third from the same address is refused at once.
    let third = tokio::time::timeout(Duration::from_secs(5), conns.admit(LOCAL)).await;
    assert!(
        third.expect("answered at once").is_none(),
        "admitted past the per-peer limit"
    );
    drop(busy.1);
    // Now one of its own is idle: it makes room, nobody else's does.
    let third = admitting(&conns, LOCAL);
    closed(&second).await;
    assert_eq!(*theirs.conn().orders().borrow(), Order::Serve);
    assert_eq!(*first.conn().orders().borrow(), Order::Serve);
    drop(second);
    let _third = third.await.expect("task").expect("admitted");
    drop(busy.0);
}

#[tokio::test]
async fn among_teams_the_one_holding_the_most_connections_gives_one_up() {
    let conns = Conns::new(4, 10);
    let quiet = conns.admit(LOCAL).await.expect("admitted");
    quiet.conn().mark_teamed("quiet");
    drop(quiet.conn().begin(false));
    let mut busy = Vec::new();
    for _ in 0..3 {
        let slot = conns.admit(LOCAL).await.expect("admitted");
        slot.conn().mark_teamed("loud");
        drop(slot.conn().begin(false));
        busy.push(slot);
    }
    let next = admitting(&conns, LOCAL);
    // `quiet` was idle the longest, but "loud" holds three connections.
    closed(&busy[0]).await;
    assert_eq!(*quiet.conn().orders().borrow(), Order::Serve);
    drop(busy.remove(0));
    let _next = next.await.expect("task").expect("admitted");
}
