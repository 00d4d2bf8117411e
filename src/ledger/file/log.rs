//! The hold log (`holds.log`): the durable intent of the file ledger, an
//! append-only file that one `fdatasync` makes durable for every write
//! queued at that moment (group commit). redb keeps the compacted state;
//! the writer folds the log into it from time to time (`disk::compact`)
//! and then starts the log over.
//!
//! # Format
//! A header, `MAGIC`, the log's **generation** (u64 LE) and the xxh3 of
//! both (u64 LE), then records: length of the payload (u32 LE), xxh3 of
//! the payload seeded with the generation (u64 LE), the payload (`encode`).
//! The file is sized ahead (`CAPACITY` of zeros, written and synced once),
//! so an append overwrites blocks that already exist and its `fdatasync`
//! has no file size or block map to write: one data write per commit.
//!
//! # Why it is safe
//! - A record counts only if its checksum, seeded with the header's
//!   generation, matches: a torn record (crash mid-append) ends the replay,
//!   and so does what an earlier generation left beyond the last record
//!   (the file is reused, never zeroed again).
//! - redb holds the generation it has applied, committed in the same
//!   transaction as the records (`disk::compact`, `disk::load`); a log
//!   whose generation is already applied is skipped, so a crash between
//!   that commit and the log's restart never counts a record twice.
//! - A new generation's header is durable before its first record is
//!   written, and is written only after redb applied the one before: a
//!   torn header hides no record that redb does not hold.

use super::disk::Op;
use std::borrow::Cow;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

const MAGIC: &[u8; 8] = b"PGHOLDS1";
/// Magic, generation, checksum.
const HEADER: u64 = 24;
/// Payload length and checksum before each payload.
const RECORD_HEAD: usize = 12;
/// Bytes sized ahead: ~8,000 misses (a hold and its end each) between
/// compactions, which the writer starts at three quarters full.
pub(super) const CAPACITY: u64 = 1 << 20;

const HOLD: u8 = 1;
const END: u8 = 2;
const SPEND: u8 = 3;

/// The open log the writer appends to.
pub(super) struct HoldLog {
    file: File,
    path: PathBuf,
    generation: u64,
    /// Where the next record goes.
    end: u64,
    capacity: u64,
    /// The header does not show `generation` yet (a failed restart): no
    /// record may be written until it does, or a replay would skip it.
    stale: bool,
}

/// What a start finds in the log: its generation and records.
pub(super) struct Replay {
    pub(super) generation: u64,
    pub(super) ops: Vec<Op>,
}

/// Reads the log at `path`: `None` when there is none, or its header is
/// not whole (then it holds nothing redb lacks: see the module doc).
pub(super) fn read(path: &Path) -> Result<Option<Replay>, String> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let Some(generation) = header(&bytes) else {
        tracing::warn!(path = %path.display(), "hold log without a whole header: nothing to replay");
        return Ok(None);
    };
    let mut ops = Vec::new();
    let mut at = HEADER as usize;
    while let Some((op, next)) = record(&bytes, at, generation) {
        ops.push(op);
        at = next;
    }
    Ok(Some(Replay { generation, ops }))
}

fn header(bytes: &[u8]) -> Option<u64> {
    let head = bytes.get(..HEADER as usize)?;
    let (body, sum) = head.split_at(16);
    if &body[..8] != MAGIC || xxh3_64(body).to_le_bytes() != sum {
        return None;
    }
    Some(u64::from_le_bytes(body[8..16].try_into().ok()?))
}

fn header_bytes(generation: u64) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&generation.to_le_bytes());
    let sum = xxh3_64(&h[..16]);
    h[16..].copy_from_slice(&sum.to_le_bytes());
    h
}

/// The record at `at` and where the next one starts, if it is whole and
/// of this generation.
fn record(bytes: &[u8], at: usize, generation: u64) -> Option<(Op, usize)> {
    let head = bytes.get(at..at.checked_add(RECORD_HEAD)?)?;
    let len = u32::from_le_bytes(head[..4].try_into().ok()?) as usize;
    let sum = u64::from_le_bytes(head[4..].try_into().ok()?);
    let start = at + RECORD_HEAD;
    let payload = bytes.get(start..start.checked_add(len)?)?;
    if len == 0 || xxh3_64_with_seed(payload, generation) != sum {
        return None;
    }
    Some((decode(payload)?, start + len))
}

impl HoldLog {
    /// Opens (or creates) the log at `path` for `generation`, sized ahead
    /// and its header durable. Call only once redb applied every earlier
    /// generation: the records still in the file stop counting.
    pub(super) fn start(path: &Path, generation: u64) -> Result<HoldLog, String> {
        let fail = |e: std::io::Error| format!("hold log {}: {e}", path.display());
        let created = !path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(fail)?;
        let len = file.metadata().map_err(fail)?.len();
        if len < CAPACITY {
            // Real zeros, not a hole: a later write then allocates nothing.
            let zeros = vec![0u8; usize::try_from(CAPACITY - len).unwrap_or(0)];
            file.write_all_at(&zeros, len).map_err(fail)?;
        }
        file.write_all_at(&header_bytes(generation), 0).map_err(fail)?;
        file.sync_all().map_err(fail)?;
        if created {
            sync_dir(path).map_err(fail)?;
        }
        Ok(HoldLog {
            file,
            path: path.to_path_buf(),
            generation,
            end: HEADER,
            capacity: len.max(CAPACITY),
            stale: false,
        })
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation
    }

    /// Writes `bytes` (records from `encode`) after the last record; not
    /// durable until `sync`. On error nothing counts as written: the next
    /// append writes over it.
    pub(super) fn append(&mut self, bytes: &[u8]) -> Result<(), String> {
        if self.stale {
            self.restart(self.generation)?;
        }
        self.file
            .write_all_at(bytes, self.end)
            .map_err(|e| format!("hold log {}: write: {e}", self.path.display()))?;
        self.end += bytes.len() as u64;
        Ok(())
    }

    /// `fdatasync`: every record appended so far is durable.
    pub(super) fn sync(&self) -> Result<(), String> {
        self.file
            .sync_data()
            .map_err(|e| format!("hold log {}: fdatasync: {e}", self.path.display()))
    }

    /// Past three quarters of the size written ahead: time to compact.
    pub(super) fn wants_compaction(&self) -> bool {
        self.end - HEADER > (self.capacity - HEADER) / 4 * 3
    }

    pub(super) fn is_empty(&self) -> bool {
        self.end == HEADER
    }

    /// Starts generation `generation` over the old one's records, once
    /// redb holds them. Until its header is durable, appends fail.
    pub(super) fn restart(&mut self, generation: u64) -> Result<(), String> {
        self.generation = generation;
        self.stale = true;
        let fail = |e: std::io::Error| format!("hold log {}: restart: {e}", self.path.display());
        self.file.write_all_at(&header_bytes(generation), 0).map_err(fail)?;
        self.file.sync_data().map_err(fail)?;
        self.end = HEADER;
        self.stale = false;
        Ok(())
    }
}

/// A new file's directory entry must be durable too.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Appends `op` as a record of `generation` to `out`; `Flush` writes
/// nothing.
pub(super) fn encode(op: &Op, generation: u64, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEAD]);
    match op {
        Op::Hold { id, team, amount, day } => {
            out.push(HOLD);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&amount.to_le_bytes());
            out.extend_from_slice(&day.to_le_bytes());
            put_str(out, team);
        }
        Op::End {
            id,
            team,
            day,
            route,
            spent,
        } => {
            out.push(END);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&day.to_le_bytes());
            out.extend_from_slice(&spent.to_le_bytes());
            put_str(out, team);
            put_str(out, route);
        }
        Op::Spend {
            team,
            day,
            route,
            spent,
        } => {
            out.push(SPEND);
            out.extend_from_slice(&day.to_le_bytes());
            out.extend_from_slice(&spent.to_le_bytes());
            put_str(out, team);
            put_str(out, route);
        }
        _ => {
            out.truncate(start);
            return;
        }
    }
    let payload = &out[start + RECORD_HEAD..];
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let sum = xxh3_64_with_seed(payload, generation);
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    out[start + 4..start + RECORD_HEAD].copy_from_slice(&sum.to_le_bytes());
}

/// A string: its length (u32 LE), its bytes.
fn put_str(out: &mut Vec<u8>, s: &str) {
    let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&s.as_bytes()[..len as usize]);
}

/// Reads a payload front to back.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_at_checked(N)?;
        self.0 = rest;
        head.try_into().ok()
    }

    fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    fn string(&mut self) -> Option<String> {
        let len = usize::try_from(self.u32()?).ok()?;
        let (s, rest) = self.0.split_at_checked(len)?;
        self.0 = rest;
        String::from_utf8(s.to_vec()).ok()
    }
}

fn decode(payload: &[u8]) -> Option<Op> {
    let mut r = Reader(payload);
    let [kind] = r.take()?;
    let op = match kind {
        HOLD => Op::Hold {
            id: r.u64()?,
            amount: r.u64()?,
            day: r.u32()?,
            team: r.string()?,
        },
        END => Op::End {
            id: r.u64()?,
            day: r.u32()?,
            spent: r.u64()?,
            team: r.string()?,
            route: Cow::Owned(r.string()?),
        },
        SPEND => Op::Spend {
            day: r.u32()?,
            spent: r.u64()?,
            team: r.string()?,
            route: Cow::Owned(r.string()?),
        },
        _ => return None,
    };
    r.0.is_empty().then_some(op)
}
