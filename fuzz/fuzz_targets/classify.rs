//! The router on arbitrary request targets: it must not panic, and a path it
//! accepts is always canonical and under /v2/.
#![no_main]

use libfuzzer_sys::fuzz_target;
use permit_gateway::route::classify;

fuzz_target!(|data: &[u8]| {
    let Ok(uri) = http::Uri::try_from(data) else { return };
    if let Ok(target) = classify(&uri, 8192) {
        assert!(target.path.starts_with("/v2/"), "escaped /v2: {uri} -> {}", target.path);
        assert!(!target.path.split('/').any(|s| s == ".." || s == "."), "dot segment left: {}", target.path);
        let again: http::Uri = target.path.parse().expect("canonical path parses");
        assert_eq!(classify(&again, 8192).expect("canonical path classifies").path, target.path);
    }
});
