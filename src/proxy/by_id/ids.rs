//! The id list of a lookup's query: read from the request ([`lookup_ids`])
//! and written for the call that buys the missing ids ([`query_of`]), as
//! the upstream reads and writes it. Used by `by_id` and `by_id::buy`.

use crate::cache::key;
use crate::route::Route;

/// The ids of a lookup's query, in order, each once. Parameters the
/// route does not declare are ignored by the upstream (FastAPI reads
/// parameters by name), so they are here too; `None` for a declared one
/// (`cursor`) or bytes that are not UTF-8: the page path forwards those as
/// sent.
pub(super) fn lookup_ids(route: Route, query: &str) -> Option<Vec<String>> {
    let pairs = key::decode_pairs(query)?;
    let mut ids: Vec<String> = Vec::with_capacity(pairs.len());
    for (name, value) in pairs {
        if name != "id" {
            if route.param(&name).is_some() {
                return None;
            }
            continue;
        }
        // The upstream answers a repeated id once, at its first position.
        if !ids.iter().any(|id| *id == value) {
            ids.push(value.into_owned());
        }
    }
    (!ids.is_empty()).then_some(ids)
}

/// `id=a&id=b`: the only list spelling the upstream reads.
pub(super) fn query_of(ids: &[String]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(ids.iter().map(|id| ("id", id)))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_id_parameters_make_a_lookup_and_repeats_count_once() {
        let ids = |q| lookup_ids(Route::PermitsById, q);
        assert_eq!(ids("id=a&id=b&id=a"), Some(vec!["a".into(), "b".into()]));
        assert_eq!(ids("id=a%2Cb"), Some(vec!["a,b".into()]), "a comma is part of the id");
        assert_eq!(ids("id=a&foo=1"), Some(vec!["a".into()]), "the upstream ignores foo");
        assert_eq!(lookup_ids(Route::ContractorsById, "id=a&cursor=x"), None);
        assert_eq!(ids("id=%FF"), None);
        assert_eq!(query_of(&["a b".into(), "c&d".into()]), "id=a+b&id=c%26d");
    }
}
