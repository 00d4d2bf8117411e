//! An estimate of the work an HPACK header block costs the decoder (RFC
//! 7541), read beside hyper's h2 from a complete block (`frames.rs`): the
//! decoded bytes of every field, a fixed cost per field representation,
//! the bytes copied by each dynamic-table insert and a cost per eviction
//! and per table size update. Only sizes are kept (a shadow of the
//! decoder's dynamic table), never the headers themselves.
//!
//! One byte of a block can make the decoder produce a whole table entry
//! (an indexed field naming a 4 KiB entry), so the bytes on the wire say
//! little about the work: an "HPACK bomb" of such references cost one
//! connection +4.7 s of CPU in 6 s (issue 60). This estimate is what the
//! connection's HPACK budget is charged.

use std::collections::VecDeque;

/// Work charged for each field representation (indexed or literal) and
/// each table size update, on top of the bytes it decodes.
pub(crate) const PER_FIELD: u64 = 64;
/// Work charged for each entry evicted from the dynamic table.
const PER_EVICTION: u64 = 32;
/// The decoder's table size: h2's default `SETTINGS_HEADER_TABLE_SIZE`,
/// which hyper keeps. A client may only lower it.
const TABLE_MAX: usize = 4096;
/// RFC 7541 §4.1: an entry's size is its name and value plus 32.
const ENTRY_OVERHEAD: usize = 32;

/// The static table's (name, value) lengths, RFC 7541 Appendix A.
const STATIC: [(u16, u16); 61] = [
    (10, 0),  // :authority
    (7, 3),   // :method GET
    (7, 4),   // :method POST
    (5, 1),   // :path /
    (5, 11),  // :path /index.html
    (7, 4),   // :scheme http
    (7, 5),   // :scheme https
    (7, 3),   // :status 200
    (7, 3),   // :status 204
    (7, 3),   // :status 206
    (7, 3),   // :status 304
    (7, 3),   // :status 400
    (7, 3),   // :status 404
    (7, 3),   // :status 500
    (14, 0),  // accept-charset
    (15, 13), // accept-encoding gzip, deflate
    (15, 0),  // accept-language
    (13, 0),  // accept-ranges
    (6, 0),   // accept
    (27, 0),  // access-control-allow-origin
    (3, 0),   // age
    (5, 0),   // allow
    (13, 0),  // authorization
    (13, 0),  // cache-control
    (19, 0),  // content-disposition
    (16, 0),  // content-encoding
    (16, 0),  // content-language
    (14, 0),  // content-length
    (16, 0),  // content-location
    (13, 0),  // content-range
    (12, 0),  // content-type
    (6, 0),   // cookie
    (4, 0),   // date
    (4, 0),   // etag
    (6, 0),   // expect
    (7, 0),   // expires
    (4, 0),   // from
    (4, 0),   // host
    (8, 0),   // if-match
    (17, 0),  // if-modified-since
    (13, 0),  // if-none-match
    (8, 0),   // if-range
    (19, 0),  // if-unmodified-since
    (13, 0),  // last-modified
    (4, 0),   // link
    (8, 0),   // location
    (12, 0),  // max-forwards
    (18, 0),  // proxy-authenticate
    (19, 0),  // proxy-authorization
    (5, 0),   // range
    (7, 0),   // referer
    (7, 0),   // refresh
    (11, 0),  // retry-after
    (6, 0),   // server
    (10, 0),  // set-cookie
    (25, 0),  // strict-transport-security
    (17, 0),  // transfer-encoding
    (10, 0),  // user-agent
    (4, 0),   // vary
    (3, 0),   // via
    (16, 0),  // www-authenticate
];

/// The sizes of a connection's decoder table (newest entry first).
#[derive(Debug)]
pub(crate) struct Table {
    entries: VecDeque<(usize, usize)>,
    size: usize,
    max: usize,
}

impl Default for Table {
    fn default() -> Table {
        Table {
            entries: VecDeque::new(),
            size: 0,
            max: TABLE_MAX,
        }
    }
}

/// A block being read: where it is and what it cost so far.
struct Cursor<'a> {
    bytes: &'a [u8],
    work: u64,
}

impl Cursor<'_> {
    /// An integer with an `n`-bit prefix (RFC 7541 §5.1); `None` when the
    /// block ends inside it or it does not fit 32 bits.
    fn int(&mut self, n: u8) -> Option<usize> {
        let (&first, rest) = self.bytes.split_first()?;
        self.bytes = rest;
        let mask = (1usize << n) - 1;
        let mut value = usize::from(first) & mask;
        if value < mask {
            return Some(value);
        }
        let mut shift = 0u32;
        loop {
            let (&b, rest) = self.bytes.split_first()?;
            self.bytes = rest;
            value = value.checked_add(usize::from(b & 0x7f).checked_shl(shift)?)?;
            if value > u32::MAX as usize {
                return None;
            }
            if b & 0x80 == 0 {
                return Some(value);
            }
            shift += 7;
        }
    }

    /// A string literal (§5.2): its decoded length, at most (a Huffman
    /// code is 5 bits or more a symbol).
    fn string(&mut self) -> Option<usize> {
        let huffman = self.bytes.first()? & 0x80 != 0;
        let len = self.int(7)?;
        if len > self.bytes.len() {
            return None;
        }
        self.bytes = &self.bytes[len..];
        Some(if huffman { len * 8 / 5 } else { len })
    }
}

impl Table {
    /// The (name, value) lengths at `index` (§2.3.3); `None` when out of range.
    fn at(&self, index: usize) -> Option<(usize, usize)> {
        match index {
            0 => None,
            1..=61 => STATIC.get(index - 1).map(|&(n, v)| (usize::from(n), usize::from(v))),
            _ => self.entries.get(index - 62).copied(),
        }
    }

    /// Makes the table at most `max`, charging the evictions.
    fn evict_to(&mut self, max: usize, work: &mut u64) {
        while self.size > max {
            let Some((n, v)) = self.entries.pop_back() else { break };
            self.size -= n + v + ENTRY_OVERHEAD;
            *work += PER_EVICTION;
        }
    }

    fn insert(&mut self, name: usize, value: usize, work: &mut u64) {
        let size = name + value + ENTRY_OVERHEAD;
        *work += size as u64;
        if size > self.max {
            self.evict_to(0, work);
            return;
        }
        self.evict_to(self.max - size, work);
        self.entries.push_front((name, value));
        self.size += size;
    }

    /// The work of decoding `block`, the table brought up to date. A block
    /// that does not decode is charged what was read of it (h2 closes the
    /// connection with a COMPRESSION_ERROR).
    pub(crate) fn work(&mut self, block: &[u8]) -> u64 {
        let mut c = Cursor { bytes: block, work: 0 };
        while let Some(&first) = c.bytes.first() {
            if self.field(&mut c, first).is_none() {
                break;
            }
        }
        c.work
    }

    /// One representation starting with `first`.
    fn field(&mut self, c: &mut Cursor<'_>, first: u8) -> Option<()> {
        c.work += PER_FIELD;
        if first & 0x80 != 0 {
            // Indexed (§6.1).
            let (n, v) = self.at(c.int(7)?)?;
            c.work += (n + v) as u64;
            return Some(());
        }
        if first & 0xe0 == 0x20 {
            // Dynamic table size update (§6.3).
            let max = c.int(5)?.min(TABLE_MAX);
            self.max = max;
            let mut work = c.work;
            self.evict_to(max, &mut work);
            c.work = work;
            return Some(());
        }
        // Literals (§6.2): with incremental indexing (6-bit index), else
        // without indexing or never indexed (4-bit).
        let indexing = first & 0xc0 == 0x40;
        let index = c.int(if indexing { 6 } else { 4 })?;
        let name = match index {
            0 => c.string()?,
            i => self.at(i)?.0,
        };
        let value = c.string()?;
        c.work += (name + value) as u64;
        if indexing {
            let mut work = c.work;
            self.insert(name, value, &mut work);
            c.work = work;
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn literal(out: &mut Vec<u8>, prefix: u8, s: &[u8]) {
        out.push(prefix);
        assert!(s.len() < 127);
        out.push(s.len() as u8);
        out.extend_from_slice(s);
    }

    #[test]
    fn an_ordinary_request_costs_little_and_a_bomb_costs_its_expansion() {
        // :method GET, :scheme https, :path /x (literal, indexed name), a
        // user-agent inserted into the table.
        let mut block = vec![0x82, 0x87, 0x04, 2, b'/', b'x'];
        literal(&mut block, 0x40 | 58, b"curl/8");
        let mut t = Table::default();
        let w = t.work(&block);
        assert_eq!(t.entries.len(), 1);
        assert!(w < 1024, "{w}");
        // A 4000-byte value inserted once, then 10,000 one-byte references.
        let mut bomb = vec![0x40, 1, b'a', 0x7f];
        let mut n = 4000 - 127;
        while n >= 128 {
            bomb.push(0x80 | (n & 0x7f) as u8);
            n >>= 7;
        }
        bomb.push(n as u8);
        bomb.extend(std::iter::repeat_n(b'v', 4000));
        bomb.extend(std::iter::repeat_n(0x80 | 62, 10_000));
        let mut t = Table::default();
        assert!(t.work(&bomb) > 40_000_000);
    }

    #[test]
    fn evictions_and_size_updates_are_charged_and_bad_blocks_stop() {
        let mut t = Table::default();
        let mut churn = Vec::new();
        for _ in 0..1000 {
            literal(&mut churn, 0x40, b"n");
            churn.push(1);
            churn.push(b'v');
        }
        let w = t.work(&churn);
        assert!(t.size <= TABLE_MAX);
        assert!(w >= 1000 * (PER_FIELD + 34), "{w}");
        let held = t.entries.len() as u64;
        assert_eq!(held, 4096 / 34);
        let updates = vec![0x20; 500];
        assert_eq!(t.work(&updates), 500 * PER_FIELD + PER_EVICTION * held);
        assert_eq!(t.max, 0);
        // Index 0, and a string running past the block's end.
        assert_eq!(t.work(&[0x80]), PER_FIELD);
        assert_eq!(t.work(&[0x00, 0x05, b'a']), PER_FIELD);
    }
}
