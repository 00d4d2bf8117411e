//! The vendor's page envelope, read and written in one place:
//! `{"items":[…],"size":n,"next_cursor":…,"total_count":…}`
//! (`docs/vendor-api.md`, "Pages"). Every list the upstream answers is one:
//! searches, id lookups, monthly metrics.
//!
//! [`Page::parse`] reads one without copying: each item is a view of the
//! body's own bytes, so a record or a month's row is filed and answered
//! byte for byte as the upstream sent it. [`assemble`] writes one from
//! such pieces, as the upstream writes an answer that has no next page.
//!
//! Who reads it: the credit count of an answer without a bill
//! (`proxy::credits`), the pages that hold another key's answer
//! (`cache::covered`), the records a page files (`cache::records`) and the
//! answers built from held pieces (`proxy::reuse`).

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::{Deserializer, IgnoredAny};
use serde::Deserialize;
use serde_json::value::RawValue;

/// What `next_cursor` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Cursor {
    /// Not in the body: it proves nothing either way.
    #[default]
    Absent,
    /// `null`: nothing follows this page.
    End,
    /// A cursor: the query has more items than this page.
    More,
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Cursor, D::Error> {
        Ok(match Option::<IgnoredAny>::deserialize(d)? {
            None => Cursor::End,
            Some(_) => Cursor::More,
        })
    }
}

/// A page envelope, its items as views of the body it was read from.
#[derive(Debug, Deserialize)]
pub(crate) struct Page<'a> {
    #[serde(borrow)]
    pub(crate) items: Vec<&'a RawValue>,
    /// Items returned, as the upstream counts them (not the size asked).
    #[serde(default)]
    pub(crate) size: Option<u64>,
    #[serde(default)]
    pub(crate) next_cursor: Cursor,
    /// The count `include_count=true` asked for; `None` when absent or null.
    #[serde(borrow, default)]
    pub(crate) total_count: Option<&'a RawValue>,
}

impl<'a> Page<'a> {
    /// The envelope of `body`; `None` when it is not one (serde would read
    /// a struct from an array too: an envelope is an object).
    pub(crate) fn parse(body: &'a [u8]) -> Option<Page<'a>> {
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        serde_json::from_slice(body).ok()
    }

    /// Items in the page.
    pub(crate) fn len(&self) -> u64 {
        self.items.len() as u64
    }

    /// One whole page: its `size` is its items and nothing follows it.
    /// Only such a page says that something it lacks does not exist.
    pub(crate) fn whole(&self) -> bool {
        self.next_cursor == Cursor::End && self.size == Some(self.len())
    }
}

/// `raw`, an item of a page read from `body`, as a view of `body`.
pub(crate) fn item_of(body: &Bytes, raw: &RawValue) -> Bytes {
    body.slice_ref(raw.get().as_bytes())
}

/// Items in a page envelope; 0 when the body is not one.
pub(crate) fn count_items(body: &[u8]) -> u64 {
    #[derive(Deserialize)]
    struct Items {
        items: Vec<IgnoredAny>,
    }
    serde_json::from_slice::<Items>(body).map_or(0, |p| p.items.len() as u64)
}

/// The page the upstream writes for `items` when nothing follows them:
/// `{"items":[…],"size":n,"next_cursor":null,"total_count":null}`, each
/// item as given.
pub(crate) fn assemble<'p>(items: impl IntoIterator<Item = &'p [u8]>) -> Bytes {
    let items: Vec<&[u8]> = items.into_iter().collect();
    let mut out = BytesMut::with_capacity(items.iter().map(|r| r.len() + 1).sum::<usize>() + 64);
    out.put_slice(b"{\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.put_u8(b',');
        }
        out.put_slice(item);
    }
    out.put_slice(b"],\"size\":");
    out.put_slice(items.len().to_string().as_bytes());
    out.put_slice(b",\"next_cursor\":null,\"total_count\":null}");
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_says_whether_anything_follows_it() {
        let p = |b: &'static str| Page::parse(b.as_bytes());
        let whole = p(r#"{"items":[1,2],"size":2,"next_cursor":null,"total_count":null}"#).expect("a page");
        assert!(whole.whole());
        assert_eq!((whole.len(), whole.total_count.is_none()), (2, true));
        assert_eq!(
            p(r#"{"items":[1],"size":1,"next_cursor":"abc"}"#).unwrap().next_cursor,
            Cursor::More
        );
        let absent = p(r#"{"items":[1],"size":1}"#).unwrap();
        assert_eq!(absent.next_cursor, Cursor::Absent, "absent is not null");
        assert!(!absent.whole());
        assert!(
            !p(r#"{"items":[1],"size":2,"next_cursor":null}"#).unwrap().whole(),
            "size says two"
        );
        assert!(p(r#"{"geo_id":"x"}"#).is_none());
        assert!(p("not json").is_none());
        assert!(p("[[1], null]").is_none(), "an array is no envelope");
    }

    #[test]
    fn items_are_views_and_assembly_writes_the_upstreams_shape() {
        let body = Bytes::from_static(br#"{"items":[{"a":1}, {"b" : 2}],"size":2,"next_cursor":null}"#);
        let page = Page::parse(&body).expect("a page");
        let items: Vec<Bytes> = page.items.iter().map(|r| item_of(&body, r)).collect();
        assert_eq!(&items[1][..], br#"{"b" : 2}"#);
        assert!(body.as_ptr_range().contains(&items[0].as_ptr()), "a view, not a copy");
        assert_eq!(
            &assemble(items.iter().map(|b| &b[..]))[..],
            br#"{"items":[{"a":1},{"b" : 2}],"size":2,"next_cursor":null,"total_count":null}"#
        );
        assert_eq!(
            &assemble([])[..],
            br#"{"items":[],"size":0,"next_cursor":null,"total_count":null}"#
        );
        assert_eq!(count_items(br#"{"items":[{},{},{}],"size":3}"#), 3);
        assert_eq!(count_items(b"nope"), 0);
    }
}
