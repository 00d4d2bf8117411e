//! The overload manager: every transport resource the listeners share is a
//! pool with an owner per tenant, a share per tenant, and an action under
//! pressure (in the manner of Envoy's overload manager). Credits, rates and
//! the cache are per team further in (`proxy/`); this is what keeps one
//! tenant from taking the transport under them.
//!
//! A tenant is a team once a valid token came on the connection, otherwise
//! the peer address (anonymous). Under pressure the manager acts on the
//! tenant holding the most, anonymous before teams, and closes at once (no
//! graceful drain that would wait for a PING ack a hostile peer never
//! sends); a newcomer never waits on a connection that is leaving.
//!
//! | pool | share | action under pressure |
//! |---|---|---|
//! | connection slots (`server.max_connections`, per listener; the admin listener has its own `server.admin_max_connections`) | a team: `max / tenants holding connections` (teams, plus one for all connections of no known team), busy or idle; for cutting a busy one, `max / teams holding connections`; a peer address: `max_connections_per_peer` | close, in [`Class`] order: anonymous, stalled, a team's idle over its share, silent before a first head (of the address holding the most such first), a team's busy over its share (newest first), still in its first head but making progress, other teams' idle; none of these: the newcomer takes one of the [`reserve`]'s slots |
//! | HTTP/2 answer bytes (`server.http2_max_buffered_bytes`, per listener) | anonymous peers together: half; a team: `max / teams holding bytes` | refuse the stream before the handler buys anything (503 + `Retry-After`); close the connection holding the most stalled bytes, anonymous first, then the team most over its share |
//! | file descriptors (`RLIMIT_NOFILE`) | [`RESERVED_DESCRIPTORS`] for the upstream pool, Redis, the ledger and the logs | at start: soft limit raised to the hard one, connection caps clamped to what remains (a warning), or refusal to start; at run time an `EMFILE` makes room like the connection cap |
//! | the access-log queue (`telemetry::access`) | anonymous lines only while team lines have room | drop the line, anonymous first (`gateway_log_lines_dropped_total`) |
//!
//! Each action counts in `gateway_overload_actions_total{listener,pool,action}`.
//! hyper gives a service no handle to reset one HTTP/2 stream, so the
//! answer-bytes action closes the connection whose streams hold the most
//! (Envoy resets the stream); with a zero window, which applies to every
//! stream of a connection, that is the same set of bytes.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a connection's answers may make no progress before it counts as
/// stalled: evictable although it is sending, and first to close when the
/// answer bytes run out. A reader that is slow but moving takes a chunk far
/// more often.
pub(super) const STALL_GRACE: Duration = Duration::from_secs(1);

/// How long an evicted idle team connection has to answer a head that came
/// in the instant it was chosen, before it is closed. Short: nobody waits on
/// it (the newcomer is admitted at once).
pub(super) const EVICT_GRACE: Duration = Duration::from_secs(1);

/// Descriptors kept back from client connections whatever the config: the
/// upstream pool (up to 64 idle connections are kept, and the upstream's
/// rate keeps calls in flight far below), the ledger's and the disk tier's
/// files, the log, the listeners and the runtime's own. Redis's sockets
/// come on top, counted from the config ([`fit_descriptors`]'s
/// `redis_sockets`): a pool of 16 connections to each node of a cluster
/// passes 64 alone, and a Redis connection that cannot reconnect for want of
/// a descriptor turns every hit of its tier into a paid miss.
pub const RESERVED_DESCRIPTORS: u64 = 64;

/// How long a connection just accepted is not held to [`PROGRESS_BYTES`]:
/// its first bytes may be in the socket, not yet read (a busy server, a
/// client a round trip away).
pub(super) const SILENT_GRACE: Duration = Duration::from_millis(100);

/// Bytes a connection must have sent before its first head to count as
/// making progress: an HTTP head is more; the 5 bytes of a record header a
/// half-open handshake sends are not. A TLS connection (its first byte a
/// handshake record's) makes progress only once its ClientHello record is
/// complete, however many bytes of it came (`conn::Early`): churn that
/// sent 105 bytes of a ClientHello and then nothing ranked with real
/// handshakes and failed up to 4.9 % of another team's (issue 60).
pub(crate) const PROGRESS_BYTES: u64 = 64;

/// Why a connection makes room for a newcomer, in the order they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Class {
    /// Answered without ever carrying a valid team token: nobody's work.
    Anonymous,
    /// A team's, whose answers took nothing for [`STALL_GRACE`]: its reader
    /// holds buffers and a slot without reading.
    Stalled,
    /// Idle, of a team holding more than its share of the slots.
    TeamOverShare,
    /// Still before its first head, having sent less than
    /// [`PROGRESS_BYTES`] in [`SILENT_GRACE`] (a half-open handshake, a
    /// silent socket): of the address holding the most such first, then
    /// oldest first.
    Silent,
    /// Busy (a request being handled, or answers moving), of a team holding
    /// more than its share of the slots: its newest first. A team's busy
    /// connections count against its share like its idle ones.
    TeamOverShareBusy,
    /// Still before its first head: just accepted (within
    /// [`SILENT_GRACE`]), or its handshake or head making progress: those
    /// that sent bytes short of progress first, then those not yet read
    /// (newest first), those making progress last ([`Early`]).
    Unstarted,
    /// Idle, of a team within its share.
    TeamIdle,
}

impl Class {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Class::Anonymous => "anonymous",
            Class::Stalled => "stalled",
            Class::TeamOverShare => "team_over_share",
            Class::Silent => "silent",
            Class::TeamOverShareBusy => "team_over_share_busy",
            Class::Unstarted => "unstarted",
            Class::TeamIdle => "team_idle",
        }
    }
}

/// What the manager reads of a connection (`conns::Conn` is one, and has
/// these only through this trait): the manager decides, the registry
/// (`conns/`) acts, and the manager names none of the registry's types.
pub(super) trait Occupant {
    fn id(&self) -> u64;
    fn born(&self) -> Instant;
    /// Told to close, or to make room.
    fn leaving(&self) -> bool;
    /// Its team (a hash of the name), once a valid token came on it.
    fn team(&self) -> Option<u64>;
    /// Whether a complete request head has arrived yet.
    fn started(&self) -> bool;
    /// Requests whose handler is still running (not yet sending).
    fn handling(&self) -> usize;
    /// Answer bytes its HTTP/2 streams hold.
    fn queued(&self) -> usize;
    /// How long answers have been waiting to be sent without progress;
    /// `None` while none is being sent.
    fn stalled_for(&self) -> Option<Duration>;
    /// When it last finished a request (or was accepted).
    fn quiet_since(&self) -> Instant;
    /// The peer's address.
    fn peer(&self) -> std::net::IpAddr;
    /// Progress before its first head: bytes read (capped at
    /// [`PROGRESS_BYTES`]), on TLS 0 until the ClientHello is complete.
    fn read_early(&self) -> u64;
}

/// The connection that makes room first among `conns` (one listener's, or
/// one peer's), with the order to send it; `None` when every one is busy
/// and no team is over its share. `max` is the slots they share.
pub(super) fn victim<'a, C, I>(conns: I, max: usize) -> Option<(&'a Arc<C>, Class)>
where
    C: Occupant + 'a,
    I: Iterator<Item = &'a Arc<C>> + Clone,
{
    let mut per_team: HashMap<u64, usize> = HashMap::new();
    let mut silent_per_peer: HashMap<std::net::IpAddr, usize> = HashMap::new();
    let mut unknown = 0;
    let now = Instant::now();
    for c in conns.clone() {
        match c.team() {
            Some(team) => *per_team.entry(team).or_default() += 1,
            None => unknown = 1,
        }
        if is_silent(Arc::as_ref(c), now) {
            *silent_per_peer.entry(c.peer()).or_default() += 1;
        }
    }
    // Connections of no known team count as one more tenant: a team alone
    // with a newcomer is not entitled to every idle slot. A busy
    // connection is cut only for another team (its share counts teams
    // alone): a connection that may be anonymous, in the newcomers'
    // reserve, never makes a team's request in flight go.
    let shares = Shares {
        idle: max / (per_team.len() + unknown).max(1),
        busy: max / per_team.len().max(1),
    };
    conns
        .filter_map(|c| class_of(Arc::as_ref(c), &per_team, shares).map(|class| (c, class)))
        .min_by_key(|(c, class)| {
            let team_conns = c.team().and_then(|t| per_team.get(&t)).copied().unwrap_or(0);
            // Silent: of the address holding the most such first.
            let peer_silent = match class {
                Class::Silent => silent_per_peer.get(&c.peer()).copied().unwrap_or(0),
                _ => 0,
            };
            let early = match class {
                Class::Unstarted => Early::of(Arc::as_ref(c)),
                _ => Early::Short,
            };
            (
                *class,
                Reverse(c.queued()),
                Reverse(team_conns),
                Reverse(peer_silent),
                early,
                age_key(Arc::as_ref(c), *class, early, now),
                c.id(),
            )
        })
}

/// What an unstarted connection has shown, in the order they go: bytes
/// short of progress (a half-open or partial handshake: known not to be
/// one), nothing read yet (perhaps a real client's hello, waiting for a
/// busy runtime to read it: newest first, so a flood's fresh arrivals take
/// each other's place, not the one waiting longest to be read), progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Early {
    Short,
    Unread,
    Progressing,
}

impl Early {
    fn of(c: &impl Occupant) -> Early {
        match c.read_early() {
            0 => Early::Unread,
            n if n < PROGRESS_BYTES => Early::Short,
            _ => Early::Progressing,
        }
    }
}

/// Before its first head, without [`PROGRESS_BYTES`] sent in
/// [`SILENT_GRACE`].
fn is_silent(c: &impl Occupant, now: Instant) -> bool {
    c.team().is_none()
        && !c.started()
        && c.read_early() < PROGRESS_BYTES
        && !c.leaving()
        && c.born() + SILENT_GRACE <= now
}

/// A team's share of the slots: for its idle connections, and for its busy ones.
#[derive(Clone, Copy)]
struct Shares {
    idle: usize,
    busy: usize,
}

fn class_of(c: &impl Occupant, per_team: &HashMap<u64, usize>, shares: Shares) -> Option<Class> {
    if c.leaving() {
        return None;
    }
    match c.team() {
        None if !c.started() && c.read_early() < PROGRESS_BYTES && c.born().elapsed() >= SILENT_GRACE => {
            Some(Class::Silent)
        }
        None if !c.started() => Some(Class::Unstarted),
        // A head being handled may be a team's first on this connection,
        // its token not checked yet: kept for the instant that takes.
        None if c.handling() > 0 => None,
        None => Some(Class::Anonymous),
        Some(team) => {
            let stalled = c.stalled_for();
            if c.handling() == 0 && stalled.is_some_and(|d| d >= STALL_GRACE) {
                return Some(Class::Stalled);
            }
            // Handling a request, or sending and moving: busy.
            let busy = c.handling() > 0 || stalled.is_some();
            let share = if busy { shares.busy } else { shares.idle };
            let over = per_team.get(&team).copied().unwrap_or(0) > share;
            match (busy, over) {
                (true, true) => Some(Class::TeamOverShareBusy),
                // A download within its team's share is never cut.
                (true, false) => None,
                (false, true) => Some(Class::TeamOverShare),
                (false, false) => Some(Class::TeamIdle),
            }
        }
    }
}

/// Within a class: idle connections quiet the longest first, a busy one
/// over its team's share newest first (the least work lost), an
/// unstarted one not yet read newest first ([`Early`]), others oldest
/// first. Smaller goes first.
fn age_key(c: &impl Occupant, class: Class, early: Early, now: Instant) -> i128 {
    let age = |t: Instant| i128::try_from(now.saturating_duration_since(t).as_nanos()).unwrap_or(i128::MAX);
    match (class, early) {
        (Class::TeamOverShare | Class::TeamIdle, _) => -age(c.quiet_since()),
        (Class::TeamOverShareBusy, _) | (Class::Unstarted, Early::Unread) => age(c.born()),
        _ => -age(c.born()),
    }
}

/// Whether a team's new HTTP/2 stream may be answered while the listener's
/// answer bytes are spent: yes while the team holds less than its share
/// (the budget over the teams holding bytes, itself counted).
pub(super) fn team_within_share<'a, C: Occupant + 'a>(
    conns: impl Iterator<Item = &'a Arc<C>>,
    team: u64,
    max: usize,
) -> bool {
    let mut per_team = held_per_team(conns);
    per_team.entry(team).or_default();
    let share = max / per_team.len();
    per_team.get(&team).copied().unwrap_or(0) < share
}

/// The answer bytes each team holds, over the teams holding any.
fn held_per_team<'a, C: Occupant + 'a>(conns: impl Iterator<Item = &'a Arc<C>>) -> HashMap<u64, usize> {
    let mut per_team: HashMap<u64, usize> = HashMap::new();
    for c in conns {
        if let (Some(team), queued @ 1..) = (c.team(), c.queued()) {
            *per_team.entry(team).or_default() += queued;
        }
    }
    per_team
}

/// The connections to close so that the answer bytes queued fall back under
/// `max`: anonymous ones holding the most first, then, of the team holding
/// the most above its share, its stalled connection holding the most; until
/// what the chosen ones hold covers the excess. Connections already leaving
/// count as freed.
pub(super) fn relieve<'a, C: Occupant + 'a>(
    conns: impl Iterator<Item = &'a Arc<C>> + Clone,
    used: usize,
    max: usize,
) -> Vec<&'a Arc<C>> {
    let leaving: usize = conns.clone().filter(|c| c.leaving()).map(|c| c.queued()).sum();
    let mut excess = used.saturating_sub(leaving).saturating_sub(max);
    let mut chosen = Vec::new();
    if excess == 0 {
        return chosen;
    }
    let holding: Vec<&Arc<C>> = conns.filter(|c| !c.leaving() && c.queued() > 0).collect();
    let most_first = |mut these: Vec<&'a Arc<C>>| {
        these.sort_by_key(|c| Reverse(c.queued()));
        these
    };
    let mut candidates = most_first(holding.iter().copied().filter(|c| c.team().is_none()).collect());
    let per_team = held_per_team(holding.iter().copied());
    let share = max / per_team.len().max(1);
    let mut over: Vec<(u64, usize)> = per_team.into_iter().filter(|(_, queued)| *queued > share).collect();
    over.sort_by_key(|(_, queued)| Reverse(*queued));
    for (team, _) in over {
        let stalled = |c: &&&Arc<C>| c.team() == Some(team) && c.stalled_for().is_some_and(|d| d >= STALL_GRACE);
        candidates.extend(most_first(holding.iter().filter(stalled).copied().collect()));
    }
    for c in candidates {
        if excess == 0 {
            break;
        }
        excess = excess.saturating_sub(c.queued());
        chosen.push(c);
    }
    chosen
}

/// The connection caps that fit the process's descriptors, and what was
/// done to fit them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptors {
    /// The soft `RLIMIT_NOFILE` after raising it (the hard limit, if allowed).
    pub limit: u64,
    pub team_max: usize,
    pub admin_max: usize,
    /// Set when a cap was lowered: the warning to log.
    pub clamped: Option<String>,
}

/// Raises the soft descriptor limit to the hard one and fits both listeners'
/// caps (plus the room [`spare`] gives connections on their way out and
/// the newcomers' [`reserve`]) under
/// it, [`RESERVED_DESCRIPTORS`] and `redis_sockets` (every Redis socket the
/// config can open, `App::redis_sockets`) kept back. `Err` when not even a
/// small listener fits.
pub fn fit_descriptors(team_max: usize, admin_max: usize, redis_sockets: usize) -> Result<Descriptors, String> {
    use rlimit::Resource;
    let (soft, hard) = Resource::NOFILE.get().map_err(|e| format!("RLIMIT_NOFILE: {e}"))?;
    let limit = match soft < hard && Resource::NOFILE.set(hard, hard).is_ok() {
        true => hard,
        false => soft,
    };
    plan(limit, team_max, admin_max, redis_sockets)
}

/// [`fit_descriptors`] for a given limit.
pub(super) fn plan(limit: u64, team_max: usize, admin_max: usize, redis_sockets: usize) -> Result<Descriptors, String> {
    let needs = |n: usize| (n + spare(n) + reserve(n)) as u64;
    let reserved = RESERVED_DESCRIPTORS + redis_sockets as u64;
    let kept = match redis_sockets {
        0 => format!("{reserved} descriptors are kept for the upstream pool, the ledger and the logs"),
        n => format!(
            "{reserved} descriptors are kept for the upstream pool, Redis ({n} sockets), the ledger and the logs"
        ),
    };
    let room = limit.saturating_sub(reserved);
    if needs(team_max) + needs(admin_max) <= room {
        return Ok(Descriptors {
            limit,
            team_max,
            admin_max,
            clamped: None,
        });
    }
    // The admin listener keeps a small cap of its own (probes and a
    // scrape), an eighth of the room at most; the team listener the rest.
    let admin = admin_max.min((room / 8) as usize).max(4);
    let mut team = team_max;
    while team > 0 && needs(team) + needs(admin) > room {
        team = (team * 15 / 16).min(team - 1);
    }
    if team < 8 {
        return Err(format!(
            "RLIMIT_NOFILE is {limit}: {kept}, which leaves too few for client connections; raise it (ulimit -n, \
             or the container's nofile limit) to at least {}, or open fewer Redis connections \
             (cache.redis_connections)",
            reserved + needs(64) + needs(admin)
        ));
    }
    let clamped = format!(
        "server.max_connections clamped from {team_max} to {team} (server.admin_max_connections {admin_max} to \
         {admin}): RLIMIT_NOFILE is {limit}, {kept}; raise the limit to serve more connections"
    );
    Ok(Descriptors {
        limit,
        team_max: team,
        admin_max: admin,
        clamped: Some(clamped),
    })
}

/// Connections a listener may hold beyond its cap while evicted ones are on
/// their way out, so a newcomer never waits on them: an eighth, at least one.
pub(super) fn spare(max: usize) -> usize {
    max / 8 + 1
}

/// Slots beyond `max` for a newcomer when every connection is busy and
/// every team within its share (`conns::Conns::place`): four teams each at
/// its share of busy slots made a fifth team with no connection wait 5.0 s
/// for the first of their answers (issue 60). A newcomer in the reserve
/// that turns out anonymous, or sends nothing, is the first to go for the
/// next one.
pub(super) fn reserve(max: usize) -> usize {
    max / 32 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caps_fit_the_descriptor_limit_or_the_start_is_refused() {
        let roomy = plan(1 << 20, 10_000, 64, 0).expect("fits");
        assert_eq!((roomy.team_max, roomy.admin_max, roomy.clamped), (10_000, 64, None));
        let tight = plan(1024, 10_000, 64, 0).expect("clamped");
        let beyond = |n: usize| n + spare(n) + reserve(n);
        let used = beyond(tight.team_max) + beyond(tight.admin_max);
        assert!(used as u64 + RESERVED_DESCRIPTORS <= 1024, "{tight:?}");
        assert!(tight.team_max > 700, "{tight:?}");
        assert!(tight
            .clamped
            .as_deref()
            .is_some_and(|w| w.contains("server.max_connections clamped")));
        let low = plan(128, 10_000, 64, 0).expect("clamped");
        assert!(low.team_max >= 8 && low.admin_max >= 4, "{low:?}");
        assert!(plan(70, 10_000, 64, 0).is_err());
    }

    #[test]
    fn redis_sockets_are_kept_on_top_of_the_reserve() {
        // 16 connections to each of 6 cluster nodes, and the ledger's and
        // the rate's: 108 sockets, more than the whole fixed reserve.
        let redis = 16 * 6 + 2 * 6;
        let with = plan(1024, 10_000, 64, redis).expect("clamped");
        let without = plan(1024, 10_000, 64, 0).expect("clamped");
        let beyond = |n: usize| n + spare(n) + reserve(n);
        let used = |d: &Descriptors| (beyond(d.team_max) + beyond(d.admin_max)) as u64;
        assert!(used(&with) + RESERVED_DESCRIPTORS + redis as u64 <= 1024, "{with:?}");
        assert!(with.team_max < without.team_max, "{with:?} {without:?}");
        let warning = with.clamped.expect("a warning");
        assert!(warning.contains("Redis (108 sockets)"), "{warning}");
        assert!(
            warning.contains(&format!("{} descriptors are kept", RESERVED_DESCRIPTORS + 108)),
            "{warning}"
        );
        // A pool too large for the limit refuses the start and names the key.
        let refused = plan(256, 10_000, 64, 200).expect_err("refused");
        assert!(refused.contains("cache.redis_connections"), "{refused}");
    }
}
