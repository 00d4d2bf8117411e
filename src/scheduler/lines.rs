//! The calls waiting at the gate, in lines: one per team and class
//! (interactive, bulk). Interactive lines are served before any bulk line
//! (bulk takes only what the others leave); within a class, lines share by
//! start-time fair queuing: each line's next call carries a virtual start
//! tag, the smallest goes first, and a grant moves its line's tag on by
//! `1 / weight`, so a team of weight 2 gets two turns to another's one. A
//! line that comes back after waiting for nothing starts at the virtual
//! clock (the last tag served): a quiet team banks no turns, and a team
//! arriving at a flood is served next.

use super::Asker;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// One call waiting for its turn.
pub(super) struct Waiter {
    pub(super) since: Instant,
    pub(super) tx: oneshot::Sender<()>,
}

/// A line: a team's interactive or bulk calls.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct LineKey {
    pub(super) team: String,
    pub(super) bulk: bool,
}

struct Line {
    waiting: VecDeque<Waiter>,
    /// The virtual start of its next call.
    tag: f64,
    weight: f64,
}

#[derive(Default)]
pub(super) struct Lines {
    lines: HashMap<LineKey, Line>,
    /// The tag last served.
    clock: f64,
    len: usize,
}

impl Lines {
    /// Calls waiting, in every line.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether a call of `asker` would find calls ahead of it: any line of
    /// its class or a better one waiting.
    pub(super) fn any_ahead(&self, asker: Asker<'_>) -> bool {
        self.lines.keys().any(|k| !k.bulk || asker.bulk)
    }

    pub(super) fn push(&mut self, asker: Asker<'_>, waiter: Waiter) {
        let key = LineKey {
            team: asker.team.to_string(),
            bulk: asker.bulk,
        };
        let clock = self.clock;
        let line = self.lines.entry(key).or_insert_with(|| Line {
            waiting: VecDeque::new(),
            tag: clock,
            weight: f64::from(asker.weight.max(1)),
        });
        line.waiting.push_back(waiter);
        self.len += 1;
    }

    /// The lines in the order they are served, after dropping the calls
    /// whose requests went away (they take no place).
    pub(super) fn order(&mut self) -> Vec<LineKey> {
        let mut gone = 0;
        self.lines.retain(|_, line| {
            let before = line.waiting.len();
            line.waiting.retain(|w| !w.tx.is_closed());
            gone += before - line.waiting.len();
            !line.waiting.is_empty()
        });
        self.len -= gone;
        let mut order: Vec<(&LineKey, f64)> = self.lines.iter().map(|(k, l)| (k, l.tag)).collect();
        order.sort_by(|(a, at), (b, bt)| {
            (a.bulk, *at, &a.team)
                .partial_cmp(&(b.bulk, *bt, &b.team))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        order.into_iter().map(|(k, _)| k.clone()).collect()
    }

    /// Gives a permit to the next call of `key`'s line, or of the lines
    /// after it in `order` when its calls all went away meanwhile. `false`
    /// when nobody took it.
    pub(super) fn grant(&mut self, order: &[LineKey], key: &LineKey) -> bool {
        let from = order.iter().position(|k| k == key).unwrap_or(0);
        for key in order[from..].iter().chain(&order[..from]) {
            let Some(line) = self.lines.get_mut(key) else { continue };
            while let Some(waiter) = line.waiting.pop_front() {
                self.len -= 1;
                if waiter.tx.send(()).is_ok() {
                    self.clock = line.tag;
                    line.tag += 1.0 / line.weight;
                    if line.waiting.is_empty() {
                        self.lines.remove(key);
                    }
                    return true;
                }
            }
            self.lines.remove(key);
        }
        false
    }

    /// Calls that would be served before a new call of `asker`: every
    /// call of a better class, and of its own class those whose tags come
    /// before the new call's.
    pub(super) fn ahead(&self, asker: Asker<'_>) -> usize {
        let own = self
            .lines
            .iter()
            .find(|(k, _)| k.team == asker.team && k.bulk == asker.bulk);
        let tag = match own {
            Some((_, line)) => line.tag + line.waiting.len() as f64 / line.weight,
            None => self.clock,
        };
        self.lines
            .iter()
            .map(|(k, line)| {
                let n = line.waiting.len();
                if k.bulk && !asker.bulk {
                    0
                } else if (!k.bulk && asker.bulk) || k.team == asker.team {
                    n
                } else {
                    // Its calls whose start tags are at or before ours.
                    let before = ((tag - line.tag) * line.weight).floor() + 1.0;
                    (before.max(0.0) as usize).min(n)
                }
            })
            .sum()
    }

    /// Per team: calls waiting (both classes) and how long the oldest has.
    pub(super) fn per_team(&self, now: Instant) -> HashMap<&str, (usize, Duration)> {
        let mut teams: HashMap<&str, (usize, Duration)> = HashMap::new();
        for (key, line) in &self.lines {
            let entry = teams.entry(key.team.as_str()).or_default();
            entry.0 += line.waiting.len();
            if let Some(w) = line.waiting.front() {
                entry.1 = entry.1.max(now.saturating_duration_since(w.since));
            }
        }
        teams
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn asker(team: &str, weight: u32, bulk: bool) -> Asker<'_> {
        Asker { team, weight, bulk }
    }

    /// Queues `n` calls of `asker`, keeping their receivers.
    fn queue(lines: &mut Lines, who: Asker<'_>, n: usize, rx: &mut Vec<(String, oneshot::Receiver<()>)>) {
        for _ in 0..n {
            let (tx, r) = oneshot::channel();
            lines.push(
                who,
                Waiter {
                    since: Instant::now(),
                    tx,
                },
            );
            rx.push((format!("{}{}", who.team, if who.bulk { "*" } else { "" }), r));
        }
    }

    /// Serves `n` permits; who got them, in order.
    fn serve(lines: &mut Lines, n: usize, rx: &mut [(String, oneshot::Receiver<()>)]) -> Vec<String> {
        let mut served = Vec::new();
        for _ in 0..n {
            let order = lines.order();
            let Some(first) = order.first().cloned() else { break };
            assert!(lines.grant(&order, &first));
            for (who, r) in rx.iter_mut() {
                if r.try_recv().is_ok() {
                    served.push(who.clone());
                }
            }
        }
        served
    }

    #[test]
    fn a_team_of_weight_two_gets_two_turns_to_another_s_one() {
        let mut lines = Lines::default();
        let mut rx = Vec::new();
        queue(&mut lines, asker("a", 2, false), 6, &mut rx);
        queue(&mut lines, asker("b", 1, false), 6, &mut rx);
        let served = serve(&mut lines, 6, &mut rx);
        let a = served.iter().filter(|w| *w == "a").count();
        assert_eq!(a, 4, "{served:?}");
    }

    #[test]
    fn bulk_calls_go_only_when_no_interactive_call_waits() {
        let mut lines = Lines::default();
        let mut rx = Vec::new();
        queue(&mut lines, asker("a", 1, true), 3, &mut rx);
        queue(&mut lines, asker("b", 1, false), 2, &mut rx);
        queue(&mut lines, asker("a", 1, false), 1, &mut rx);
        // Every interactive call, and the bulk call whose tag ties with c's.
        assert_eq!(lines.ahead(asker("c", 1, true)), 4);
        assert_eq!(lines.ahead(asker("c", 1, false)), 2, "one of b's, one of a's");
        let served = serve(&mut lines, 6, &mut rx);
        assert_eq!(served[3..], ["a*", "a*", "a*"], "{served:?}");
    }

    #[test]
    fn a_team_arriving_at_a_flood_is_served_next() {
        let mut lines = Lines::default();
        let mut rx = Vec::new();
        queue(&mut lines, asker("flood", 1, false), 20, &mut rx);
        serve(&mut lines, 10, &mut rx);
        queue(&mut lines, asker("light", 1, false), 1, &mut rx);
        assert!(lines.ahead(asker("light", 1, false)) <= 2);
        let served = serve(&mut lines, 2, &mut rx);
        assert!(served.contains(&"light".to_string()), "{served:?}");
    }

    #[test]
    fn calls_that_went_away_take_no_place() {
        let mut lines = Lines::default();
        let mut rx = Vec::new();
        queue(&mut lines, asker("a", 1, false), 3, &mut rx);
        rx.truncate(1);
        assert_eq!(lines.order().len(), 1);
        assert_eq!(lines.len(), 1);
    }
}
