//! The cache-key normalizer on arbitrary query strings: it must not panic,
//! must be idempotent, and must give one key to any order of parameters.
#![no_main]

use libfuzzer_sys::fuzz_target;
use permit_gateway::cache::key::normalize_query;
use permit_gateway::route::Route;

fuzz_target!(|data: &[u8]| {
    let Ok(query) = std::str::from_utf8(data) else { return };
    for route in Route::ALL {
        let once = normalize_query(route, query);
        if !once.starts_with('!') {
            assert_eq!(normalize_query(route, &once), once, "not idempotent for {query:?}");
        }
        let mut parts: Vec<&str> = query.split('&').collect();
        parts.reverse();
        let reversed = parts.join("&");
        let distinct = {
            let mut names: Vec<&str> = query.split('&').map(|p| p.split('=').next().unwrap_or("")).collect();
            let n = names.len();
            names.sort_unstable();
            names.dedup();
            names.len() == n
        };
        // Undecodable queries are kept verbatim on purpose (order included).
        if distinct && !once.starts_with('!') {
            assert_eq!(normalize_query(route, &reversed), once, "order changed the key for {query:?}");
        }
    }
});
