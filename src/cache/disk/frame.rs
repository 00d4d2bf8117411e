//! The form a value is stored in: the xxh3 of the entry's encoding, then
//! the encoding. A value torn by a crash or changed on the volume fails
//! its checksum and is never served.

use crate::cache::Entry;
use bytes::Bytes;
use xxhash_rust::xxh3::xxh3_64;

/// Where the route code sits in a framed value: the frame's checksum, then
/// `Entry::encode`'s version, credits, stored-at and TTL.
pub(super) const ROUTE_AT: usize = 8 + 25;

/// The stored form of an entry: the xxh3 of its encoding, then it.
pub(super) fn frame(entry: &Entry) -> Vec<u8> {
    let encoded = entry.encode();
    let mut out = Vec::with_capacity(encoded.len() + 8);
    out.extend_from_slice(&xxh3_64(&encoded).to_be_bytes());
    out.extend_from_slice(&encoded);
    out
}

/// The checksum a stored value carries (a removal names the value it
/// found by it: a newer write stays).
pub(super) fn frame_sum(value: &[u8]) -> u64 {
    value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// The entry of a stored value; `None` when any byte of it changed.
pub(super) fn unframe(value: &[u8]) -> Option<Entry> {
    let encoded = value.get(8..)?;
    if xxh3_64(encoded) != frame_sum(value) {
        return None;
    }
    Entry::decode(Bytes::copy_from_slice(encoded))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::disk::tests::entry;
    use crate::route::Route;

    #[test]
    fn a_changed_byte_anywhere_fails_the_frame() {
        let e = entry(r#"{"items":[]}"#, Route::PermitsSearch);
        let framed = frame(&e);
        assert_eq!(unframe(&framed).as_ref(), Some(&*e));
        for i in 0..framed.len() {
            let mut bad = framed.clone();
            bad[i] ^= 0x10;
            assert_eq!(unframe(&bad), None, "byte {i}");
        }
        assert_eq!(framed[ROUTE_AT] as usize, Route::PermitsSearch.index());
    }
}
