//! The registry's choices: who makes room, who waits, who is refused.

use super::*;
use crate::auth::tenant_of;

const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

fn registry(max: usize, max_per_peer: usize) -> Arc<Conns> {
    Conns::new(max, max_per_peer, Budget::new(1 << 20), Actions::default())
}

/// A connection of `team` that answered one request and is idle.
async fn idle_of(conns: &Arc<Conns>, team: &str) -> Slot {
    let slot = conns.admit(LOCAL).await.expect("admitted");
    slot.conn().mark_teamed(tenant_of(team));
    drop(slot.conn().begin(false));
    slot
}

/// Admits a newcomer in a task; returns it.
fn admitting(conns: &Arc<Conns>, peer: IpAddr) -> tokio::task::JoinHandle<Option<Slot>> {
    let conns = conns.clone();
    tokio::spawn(async move { conns.admit(peer).await })
}

fn order_of(slot: &Slot) -> Order {
    slot.conn().current_order()
}

/// Admitted within a few seconds (a test that fails does not hang).
async fn admitted(newcomer: tokio::task::JoinHandle<Option<Slot>>) -> Slot {
    tokio::time::timeout(Duration::from_secs(5), newcomer)
        .await
        .expect("admitted in time")
        .expect("task")
        .expect("admitted")
}

#[tokio::test]
async fn at_the_limit_an_idle_team_connection_makes_room_and_the_newcomer_does_not_wait_for_it() {
    let conns = registry(2, 10);
    let busy = idle_of(&conns, "a").await;
    let _request = busy.conn().begin(false);
    let idle = idle_of(&conns, "a").await;
    // The victim is told to go, and the newcomer is in before it has gone.
    let third = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&idle), Order::Evict, "idle: finishes a racing head, then goes");
    assert_eq!(order_of(&busy), Order::Serve, "in flight: kept");
    assert_eq!(conns.lock().by_id.len(), 3, "the leaving one is still open");
    drop((idle, third));
}

#[tokio::test]
async fn anonymous_connections_go_first_and_at_once_even_with_an_answer_held() {
    let conns = registry(3, 10);
    let team = idle_of(&conns, "a").await;
    let fresh = conns.admit(LOCAL).await.expect("admitted");
    let anonymous = conns.admit(LOCAL).await.expect("admitted");
    // Its token-less request was answered; the answer is still held (a
    // zero-window HTTP/2 peer): before, that made it unevictable.
    let queued = (anonymous.conn().begin(true), anonymous.conn().sending());
    let _next = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&anonymous), Order::Close, "closed at once, no graceful drain");
    assert_eq!(order_of(&fresh), Order::Serve, "still reading its first head");
    assert_eq!(order_of(&team), Order::Serve, "a team's");
    drop(queued);
}

#[tokio::test]
async fn connections_that_never_sent_a_head_go_before_a_teams_idle_one_within_its_share() {
    let conns = registry(2, 10);
    let kept_alive = idle_of(&conns, "a").await;
    let silent = conns.admit(LOCAL).await.expect("admitted");
    let _third = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&silent), Order::Close);
    assert_eq!(order_of(&kept_alive), Order::Serve, "older, but it has served");
}

#[tokio::test]
async fn a_team_over_its_share_gives_up_an_idle_connection_before_another_teams_newcomer_goes() {
    let conns = registry(5, 10);
    let other = idle_of(&conns, "b").await;
    let mut churner = Vec::new();
    for _ in 0..3 {
        churner.push(idle_of(&conns, "a").await);
    }
    // Another team's newcomer, its first head still on the way.
    let newcomer = conns.admit(LOCAL).await.expect("admitted");
    let _next = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(
        order_of(&newcomer),
        Order::Serve,
        "a first head is not cut for a team over its share"
    );
    assert_eq!(order_of(&other), Order::Serve);
    assert!(
        churner.iter().any(|c| order_of(c) == Order::Evict),
        "team a holds 3 of 5 slots shared by 2 teams"
    );
}

#[tokio::test]
async fn a_newcomer_takes_a_reserve_slot_while_every_connection_is_busy_then_one_waits() {
    let conns = registry(1, 10);
    // A head being handled (its token not checked yet: kept).
    let only = conns.admit(LOCAL).await.expect("admitted");
    let request = only.conn().begin(false);
    // Every slot busy, nobody over a share: a newcomer (perhaps a team
    // holding none) takes the reserve's slot, nobody is told to go.
    let reserve = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&only), Order::Serve, "a busy connection is kept");
    // Its head being handled too: the reserve is full, the next one waits.
    let head = reserve.conn().begin(false);
    let waiting = admitting(&conns, LOCAL);
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "admitted past the limit and the reserve");
    // The request ends (answered, no team): the connection gives its place.
    drop(request);
    let _admitted = admitted(waiting).await;
    assert_eq!(order_of(&only), Order::Close);
    assert_eq!(order_of(&reserve), Order::Serve);
    drop(head);
}

#[tokio::test]
async fn a_teams_download_in_progress_is_never_evicted() {
    let conns = registry(1, 10);
    let only = idle_of(&conns, "a").await;
    // As `body.rs` does: the request's guard stays with the answer.
    let sending = (only.conn().begin(false), only.conn().sending());
    // The newcomer takes the reserve's slot: the download goes on.
    let _reserve = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&only), Order::Serve);
    assert!(only.conn().stalled_for().is_some());
    drop(sending);
    assert!(only.conn().stalled_for().is_none());
}

#[tokio::test]
async fn a_fifth_team_beside_four_at_their_share_of_busy_slots_is_admitted_and_then_room_is_made() {
    let conns = registry(8, 100);
    let mut held = Vec::new();
    for team in ["a", "b", "c", "d"] {
        for _ in 0..2 {
            let slot = idle_of(&conns, team).await;
            let request = slot.conn().begin(false);
            held.push((slot, request));
        }
    }
    // No team over its share (8 / 4): the newcomer takes a reserve slot.
    let fifth = admitted(admitting(&conns, LOCAL)).await;
    assert!(held.iter().all(|(s, _)| order_of(s) == Order::Serve));
    // Its token seen and its request handled: five tenants, a share of 1,
    // so the next newcomer makes a busy connection of a team holding 2 go.
    fifth.conn().mark_teamed(tenant_of("e"));
    let _request = fifth.conn().begin(false);
    let _next = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(held.iter().filter(|(s, _)| order_of(s) != Order::Serve).count(), 1);
    assert_eq!(order_of(&fifth), Order::Serve);
}

#[tokio::test]
async fn one_peer_beyond_its_limit_displaces_its_own_connections_or_is_refused() {
    let other: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
    let conns = registry(10, 2);
    let theirs = conns.admit(other).await.expect("admitted");
    let first = idle_of(&conns, "a").await;
    let second = idle_of(&conns, "a").await;
    let busy = (first.conn().begin(false), second.conn().begin(false));
    // Both busy: the third from the same address is refused at once.
    let third = tokio::time::timeout(Duration::from_secs(5), conns.admit(LOCAL)).await;
    assert!(
        third.expect("answered at once").is_none(),
        "admitted past the per-peer limit"
    );
    drop(busy.1);
    // Now one of its own is idle: it makes room, nobody else's does.
    let _third = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&second), Order::Evict);
    assert_eq!(order_of(&theirs), Order::Serve);
    assert_eq!(order_of(&first), Order::Serve);
    drop(busy.0);
}

#[tokio::test]
async fn among_teams_the_one_holding_the_most_connections_gives_one_up() {
    let conns = registry(4, 10);
    let quiet = idle_of(&conns, "quiet").await;
    let mut loud = Vec::new();
    for _ in 0..3 {
        loud.push(idle_of(&conns, "loud").await);
    }
    let _next = admitted(admitting(&conns, LOCAL)).await;
    // `quiet` was idle the longest, but "loud" holds three connections.
    assert_eq!(order_of(&loud[0]), Order::Evict);
    assert_eq!(order_of(&quiet), Order::Serve);
}

#[tokio::test]
async fn past_the_answer_bytes_a_team_within_its_share_is_answered_and_the_anonymous_holder_closed() {
    let budget = Budget::new(1000);
    let conns = Conns::new(8, 8, budget.clone(), Actions::default());
    let anonymous = conns.admit(LOCAL).await.expect("admitted");
    let _held = anonymous.conn().begin(true);
    anonymous.conn().hold(1200);
    assert_eq!(
        order_of(&anonymous),
        Order::Close,
        "past the bound: the anonymous holder goes"
    );
    assert!(!anonymous.conn().may_answer_anonymous());
    let team = conns.admit(LOCAL).await.expect("admitted");
    let _request = team.conn().begin(true);
    team.conn().mark_teamed(tenant_of("b"));
    assert!(team.conn().may_answer(), "team b holds nothing: within its share");
    team.conn().hold(600);
    assert!(
        team.conn().may_answer(),
        "anonymous bytes never count against a team's share"
    );
    team.conn().hold(400);
    assert!(
        !team.conn().may_answer(),
        "the only team holding bytes, and it holds the whole budget"
    );
    anonymous.conn().release(1200);
    team.conn().release(1000);
    assert!(team.conn().may_answer());
}

#[tokio::test]
async fn a_head_in_the_reserve_never_makes_a_teams_request_in_flight_go() {
    let conns = registry(2, 10);
    let mut busy = Vec::new();
    for _ in 0..2 {
        let slot = idle_of(&conns, "a").await;
        let request = slot.conn().begin(false);
        busy.push((slot, request));
    }
    // An anonymous head being handled in the reserve: no team yet.
    let reserve = admitted(admitting(&conns, LOCAL)).await;
    let head = reserve.conn().begin(false);
    let waiting = admitting(&conns, LOCAL);
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "admitted past the limit and the reserve");
    assert!(
        busy.iter().all(|(s, _)| order_of(s) == Order::Serve),
        "a request in flight was cut"
    );
    // Its head answered without a token: anonymous, it goes first.
    drop(head);
    let _admitted = admitted(waiting).await;
    assert_eq!(order_of(&reserve), Order::Close);
}

#[tokio::test]
async fn among_fresh_connections_a_short_handshake_goes_first_then_the_newest_not_yet_read() {
    let conns = registry(4, 10);
    // Oldest first: a hello waiting to be read, a complete hello, then
    // two the runtime has not read yet, then a partial handshake.
    let waiting = conns.admit(LOCAL).await.expect("admitted");
    let hello = conns.admit(LOCAL).await.expect("admitted");
    hello.conn().read_to(overload::PROGRESS_BYTES);
    let unread = conns.admit(LOCAL).await.expect("admitted");
    let partial = conns.admit(LOCAL).await.expect("admitted");
    partial.conn().read_to(1);
    let fifth = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(
        order_of(&partial),
        Order::Close,
        "bytes short of a hello: known not to be one"
    );
    drop(partial);
    // Three not read yet: the newest goes, twice.
    let sixth = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&fifth), Order::Close, "not yet read: the newest first");
    drop(fifth);
    let _seventh = admitted(admitting(&conns, LOCAL)).await;
    assert_eq!(order_of(&sixth), Order::Close, "not yet read: the newest first");
    assert_eq!(order_of(&unread), Order::Serve, "older, not yet read: kept");
    assert_eq!(order_of(&waiting), Order::Serve, "waiting longest to be read: kept");
    assert_eq!(order_of(&hello), Order::Serve, "progress: kept last");
    drop((waiting, hello, unread));
}
