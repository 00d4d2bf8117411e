//! Loading and validation of the configuration.

use super::*;

const KEY: &str = "[upstream]\napi_key = \"k\"\n";

fn load(text: &str) -> Result<Config, ConfigErrors> {
    Config::load(Source::Text(text))
}

mod not_after;

#[test]
fn defaults_alone_need_only_the_upstream_key() {
    let c = load(KEY).expect("defaults plus a key are valid");
    assert_eq!(c.upstream.requests_per_minute, 120);
    assert_eq!(c.quota.window, crate::ledger::Window::Rolling30d);
    assert!(c.teams.is_empty());
}

#[test]
fn demo_config_is_valid_with_a_key() {
    let text = format!("{DEMO_TOML}\n{KEY}");
    let c = Config::load_checked(Source::Text(&text), Checks::demo()).expect("demo config valid");
    assert_eq!(c.teams.len(), 2);
}

#[test]
fn the_demo_tokens_are_refused_outside_the_demo_naming_each_team() {
    let text = format!("{DEMO_TOML}\n{KEY}");
    let errs = load(&text).expect_err("demo tokens outside the demo").0;
    for want in [
        "teams[0].token_sha256: team \"growth\" would accept the public demo token \"pgw_demo_growth\"",
        "teams[1].token_sha256: team \"analytics\" would accept the public demo token \"pgw_demo_analytics\"",
        "admin.token_sha256: the admin API would accept the public demo token \"pgw_demo_admin\"",
    ] {
        assert!(errs.iter().any(|e| e.starts_with(want)), "{want}: {errs:#?}");
    }
}

#[test]
fn without_secrets_the_missing_key_is_no_problem_but_others_are() {
    assert!(load("").is_err(), "the key is required by default");
    Config::load_checked(Source::Text(""), Checks::without_secrets()).expect("valid without the key");
    let errs = Config::load_checked(
        Source::Text("[upstream]\ntimeout_secs = 0\n"),
        Checks::without_secrets(),
    )
    .expect_err("a zero timeout")
    .0;
    assert_eq!(errs, vec!["upstream.timeout_secs: must be positive".to_string()]);
}

#[test]
fn messages_use_one_path_style_and_plain_words() {
    let text = format!(
        "{KEY}[server]\nmax_connections = \"many\"\n[[teams]]\nname = \"a\"\ntoken_sha256 = \"{}\"\nrequests_per_minute = -1\nsurprise = 1\n",
        "0".repeat(63) + "1"
    );
    let errs = load(&text).expect_err("invalid").0;
    let all = errs.join("\n");
    assert!(!all.contains("teams.0"), "{all}");
    assert!(
        !all.contains("usize") && !all.contains("u32") && !all.contains("invalid type"),
        "{all}"
    );
    for want in [
        "server.max_connections: the text \"many\" is not allowed here: expected a whole number, 0 or more",
        "teams[0].requests_per_minute: -1 is not allowed here: expected a whole number from 0 to 4294967295",
        "teams[0].surprise: unknown key",
    ] {
        assert!(errs.iter().any(|e| e == want), "{want}: {errs:#?}");
    }
}

#[test]
fn a_key_written_in_a_file_is_accepted_with_a_warning() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, "teams = []\n[upstream]\napi_key = \"in-the-file\"\n").expect("write");
    let c = Config::load(Source::File(&path)).expect("valid");
    assert_eq!(c.warnings().len(), 2, "{:?}", c.warnings());
    assert!(c.warnings()[0].starts_with("upstream.api_key:"), "{:?}", c.warnings());
    assert!(c.warnings()[1].starts_with("teams:"), "and no team: {:?}", c.warnings());
    assert!(
        !c.warnings().iter().any(|w| w.contains("in-the-file")),
        "the key itself is never printed"
    );
    // From the environment or a key file: nothing to warn about.
    let with_team = format!("{KEY}[[teams]]\nname = \"a\"\ntoken_sha256 = \"{}\"\n", "a".repeat(64));
    assert!(load(&with_team).expect("valid").warnings().is_empty());
}

#[test]
fn a_relative_ledger_path_is_taken_from_the_config_files_folder() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("gw.toml");
    std::fs::write(&path, format!("{KEY}[quota]\npath = \"data/ledger\"\n")).expect("write");
    let c = Config::load(Source::File(&path)).expect("valid");
    assert_eq!(c.quota.path, dir.path().join("data/ledger"));
    std::fs::write(&path, format!("{KEY}[quota]\npath = \"/srv/ledger\"\n")).expect("write");
    let c = Config::load(Source::File(&path)).expect("valid");
    assert_eq!(c.quota.path, std::path::PathBuf::from("/srv/ledger"));
    // No file: the working directory's, made absolute (every log line
    // names one place).
    assert_eq!(
        load(KEY).expect("valid").quota.path,
        std::path::absolute("data/ledger").expect("absolute")
    );
}

#[test]
fn a_reload_lists_the_settings_it_cannot_apply_by_key() {
    let old = load(KEY).expect("valid");
    let same = load(&format!(
        "{KEY}[[teams]]\nname = \"new\"\ntoken_sha256 = \"{}\"\n",
        "a".repeat(64)
    ))
    .expect("valid");
    assert!(old.restart_required(&same).is_empty(), "teams apply on reload");
    let new = load(
        "[upstream]\napi_key = \"k2\"\nrequests_per_minute = 60\n[server]\nlisten = \"0.0.0.0:8081\"\n\
         [cache.route_ttl_secs]\npermits_search = 5\n",
    )
    .expect("valid");
    assert_eq!(
        old.restart_required(&new),
        [
            "cache.route_ttl_secs.permits_search",
            "server.listen",
            "upstream.api_key",
            "upstream.requests_per_minute"
        ]
    );
}

#[test]
fn every_problem_is_reported_at_once_with_its_key_path() {
    let text = r#"
        [server]
        listen = "nope"
        admin_listen = "localhost"
        [upstream]
        base_url = "ftp://x"
        [quota]
        window = "weekly"
        store = "sqlite"
        [log]
        format = "xml"
        [[teams]]
        name = "Bad Name"
        token_sha256 = "abc"
        [[teams]]
        name = "ok"
        token_sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
        requests_per_minute = 0
        [admin]
        metrics_auth = true
    "#;
    let errs = load(text).expect_err("invalid").0;
    for key in [
        "server.listen",
        "server.admin_listen",
        "upstream.base_url",
        "quota.window",
        "quota.store",
        "log.format",
        "teams[0].name",
        "teams[0].token_sha256",
        "teams[1].requests_per_minute",
        "upstream.api_key",
        "admin.metrics_auth",
    ] {
        assert!(errs.iter().any(|e| e.starts_with(key)), "{key} missing from {errs:#?}");
    }
}

#[test]
fn typed_keys_say_what_they_accept() {
    let text = format!(
        "{KEY}[server]\nlisten = \"nope\"\nruntime = \"bogus\"\n[quota]\nwindow = \"weekly\"\nstore = \"sqlite\"\n[log]\nformat = \"xml\"\n"
    );
    let errs = load(&text).expect_err("invalid").0;
    for (key, says) in [
        ("server.listen", "\"nope\" is not an address like 0.0.0.0:8080"),
        ("server.runtime", "`multi_thread`"),
        ("server.runtime", "`per_core`"),
        ("quota.window", "`rolling_30d`"),
        ("quota.window", "`calendar_month`"),
        ("quota.store", "`file`"),
        ("quota.store", "`redis`"),
        ("log.format", "`human`"),
        ("log.format", "`json`"),
    ] {
        assert!(
            errs.iter().any(|e| e.starts_with(key) && e.contains(says)),
            "{key} should say {says}: {errs:#?}"
        );
    }
}

#[test]
fn a_wrong_type_in_a_team_does_not_hide_the_others_problems() {
    let text = format!(
        "{KEY}[[teams]]\nname = \"a\"\ntoken_sha256 = \"abc\"\ncredit_limit = \"lots\"\nrequests_per_minute = -1\n[[teams]]\nname = \"Bad\"\ntoken_sha256 = \"00\"\n"
    );
    let errs = load(&text).expect_err("invalid").0;
    for key in [
        "teams[0].credit_limit",
        "teams[0].requests_per_minute",
        "teams[0].token_sha256",
        "teams[1].name",
    ] {
        assert!(errs.iter().any(|e| e.starts_with(key)), "{key} missing from {errs:#?}");
    }
}

#[test]
fn a_required_key_of_the_wrong_type_is_reported_once() {
    let text = format!("{KEY}[[teams]]\nname = 5\ntoken_sha256 = \"abc\"\n");
    let errs = load(&text).expect_err("invalid").0;
    assert!(errs.iter().any(|e| e.starts_with("teams[0].name")), "{errs:#?}");
    assert!(
        !errs.iter().any(|e| e.contains("missing") || e.contains("not set")),
        "{errs:#?}"
    );
}

#[test]
fn calendar_month_and_the_redis_store_are_read_as_such() {
    let c = load(&format!(
        "{KEY}[quota]\nwindow = \"calendar_month\"\nstore = \"redis\"\n[cache]\nredis_url = \"redis://h:6379\"\n[log]\nformat = \"json\"\n"
    ))
    .expect("valid");
    assert_eq!(c.quota.window, crate::ledger::Window::CalendarMonth);
    assert_eq!(c.quota.store, QuotaStore::Redis);
    assert_eq!(c.log.format, LogFormat::Json);
    // The quota store falls back to the cache's Redis.
    assert_eq!(c.quota_redis_url().map(Secret::expose), Some("redis://h:6379"));
}

#[test]
fn unknown_keys_are_rejected_all_together() {
    let text = format!("{KEY}\n[server]\nlisten_port = 1\n[cache]\nttl = 5\n[bogus]\nx = 1\n");
    let errs = load(&text).expect_err("unknown keys").0;
    for key in ["server.listen_port", "cache.ttl", "bogus"] {
        assert!(
            errs.iter().any(|e| e.contains(key) && e.contains("unknown")),
            "{key}: {errs:#?}"
        );
    }
}

#[test]
fn type_errors_name_their_key() {
    let text = format!("{KEY}timeout_secs = \"soon\"\n");
    let errs = load(&text).expect_err("type error").0;
    assert!(errs.iter().any(|e| e.starts_with("upstream.timeout_secs")), "{errs:#?}");
}

#[test]
fn secrets_are_redacted_in_the_printed_config() {
    let text = "[upstream]\napi_key = \"super-secret-key\"\n[cache]\nredis_url = \"redis://:pw@h:6379\"\n";
    let c = load(text).expect("valid");
    let printed = c.redacted_toml();
    assert!(!printed.contains("super-secret-key"));
    assert!(!printed.contains(":pw@"));
    assert!(!format!("{c:?}").contains("super-secret-key"));
}

#[test]
fn the_key_can_come_from_a_file() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("key");
    std::fs::write(&path, "from-file\n").expect("write");
    let text = format!("[upstream]\napi_key_file = {:?}\n", path.display().to_string());
    let c = load(&text).expect("valid");
    assert_eq!(c.upstream_key().expect("key").expose(), "from-file");
}

#[test]
fn route_ttls_come_from_the_route_table_unless_configured() {
    use crate::route::Route;
    use std::time::Duration;
    let c = load(&format!(
        "{KEY}[cache]\ndefault_ttl_secs = 60\n[cache.route_ttl_secs]\nlist_tags = 5\ncities_search = 0\n"
    ))
    .expect("valid");
    let ttl = |r| c.cache.ttl_for(r);
    // The contract routes keep the TTLs they always had.
    assert_eq!(ttl(Route::PermitsSearch), Some(Duration::from_secs(86_400)));
    assert_eq!(ttl(Route::Counties), Some(Duration::from_secs(604_800)));
    assert_eq!(ttl(Route::MetaRelease), Some(Duration::from_secs(300)));
    // New ones by class, unknown paths by the default, overrides win.
    assert_eq!(ttl(Route::PermitsById), Some(Duration::from_secs(86_400)));
    assert_eq!(ttl(Route::AddressesSearch), Some(Duration::from_secs(604_800)));
    assert_eq!(ttl(Route::Other), Some(Duration::from_secs(60)));
    assert_eq!(ttl(Route::ListTags), Some(Duration::from_secs(5)));
    assert_eq!(ttl(Route::CitiesSearch), None);
    assert_eq!(ttl(Route::Usage), None);
}

#[test]
fn a_cluster_url_is_accepted_and_a_bad_one_named_without_its_password() {
    let ok = format!("{KEY}[cache]\nredis_url = \"redis+cluster://:pw@10.0.0.1:7000,10.0.0.2:7000\"\n");
    load(&ok).expect("a cluster URL is valid");
    let bad =
        format!("{KEY}[cache]\nredis_url = \"redis+cluster://:hunter2@h:1/5\"\nredis_key_prefix = \"pgw{{x}}:\"\n");
    let errs = load(&bad).expect_err("invalid").0;
    for key in ["cache.redis_url", "cache.redis_key_prefix"] {
        assert!(errs.iter().any(|e| e.starts_with(key)), "{key} missing from {errs:#?}");
    }
    assert!(errs.iter().all(|e| !e.contains("hunter2")), "{errs:#?}");
}

#[test]
fn a_coalesce_wait_shorter_than_the_call_it_covers_is_refused() {
    // 500 ms was once accepted, and a second replica then bought the key.
    let short = format!("{KEY}timeout_secs = 30\nmax_queue_wait_secs = 10\n[cache]\ncoalesce_wait_ms = 500\n");
    let errs = load(&short).expect_err("too short").0;
    assert!(
        errs.iter()
            .any(|e| e.starts_with("cache.coalesce_wait_ms") && e.contains("45000")),
        "{errs:#?}"
    );
    // The call alone is not enough: the peer's lease also covers its
    // settle, the margin `reservation_lease_secs` keeps too (defaults.toml).
    let call_only = format!("{KEY}timeout_secs = 1\nmax_queue_wait_secs = 0\n[cache]\ncoalesce_wait_ms = 1000\n");
    let errs = load(&call_only).expect_err("no margin").0;
    assert!(
        errs.iter()
            .any(|e| e.starts_with("cache.coalesce_wait_ms") && e.contains("(6000)")),
        "{errs:#?}"
    );
    let enough = format!("{KEY}timeout_secs = 1\nmax_queue_wait_secs = 0\n[cache]\ncoalesce_wait_ms = 6000\n");
    load(&enough).expect("a wait that covers queue, call and settle is valid");
    // The default covers the default path exactly: 10 + 30 + 5 s.
    let defaults = load(KEY).expect("defaults are valid");
    assert_eq!(defaults.cache.coalesce_wait_ms, defaults.reservation_path_secs() * 1000);
}

#[test]
fn the_ledger_clock_shift_is_bounded() {
    let far = format!("{KEY}[quota]\nclock_offset_secs = -99999999\n");
    let errs = load(&far).expect_err("too far").0;
    assert!(
        errs.iter().any(|e| e.starts_with("quota.clock_offset_secs")),
        "{errs:#?}"
    );
    let day = format!("{KEY}[quota]\nclock_offset_secs = 86400\n");
    assert_eq!(load(&day).expect("a day is fine").quota.clock_offset_secs, 86_400);
}

#[test]
fn tls_and_sentinel_urls_are_accepted_and_their_secrets_redacted() {
    let text = format!(
        "{KEY}[cache]\nredis_url = \"rediss+sentinel://app:url-pw@s1:26379,s2:26379/mymaster\"\n\
         [quota]\nredis_url = \"rediss://app:url-pw@h:6380\"\n\
         [redis]\nsentinel_username = \"watcher\"\nsentinel_password = \"sentinel-pw\"\n"
    );
    let c = load(&text).expect("valid");
    for printed in [c.redacted_toml(), format!("{c:?}")] {
        assert!(
            !printed.contains("url-pw") && !printed.contains("sentinel-pw"),
            "{printed}"
        );
    }
}

#[test]
fn redis_tls_files_are_checked_and_named() {
    let dir = tempfile::tempdir().expect("tmp");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not pem").expect("write");
    let text = format!(
        "{KEY}[redis]\ntls_ca_file = {:?}\ntls_cert_file = {:?}\n",
        junk.display().to_string(),
        dir.path().join("missing.pem").display().to_string()
    );
    let errs = load(&text).expect_err("invalid").0;
    for key in ["redis.tls_key_file: required", "redis.tls_ca_file"] {
        assert!(errs.iter().any(|e| e.starts_with(key)), "{key} missing from {errs:#?}");
    }
}

/// The problems of `text` over the defaults and the upstream key.
fn problems(text: &str) -> Vec<String> {
    load(&format!("{KEY}{text}")).expect_err("invalid").0
}

#[test]
fn the_base_url_is_split_once_into_what_each_call_reuses() {
    let c = load(&format!("{KEY}base_url = \"https://api.example.com:8443/prefix/\"\n")).expect("valid");
    let uri = c.upstream.base_url.join("/v2/permits/search", Some("geo_id=1&size=5"));
    assert_eq!(
        uri.map(|u| u.to_string()).as_deref(),
        Some("https://api.example.com:8443/prefix/v2/permits/search?geo_id=1&size=5")
    );
    // Printed back as written, less the trailing slash (the same base).
    assert_eq!(c.upstream.base_url.to_string(), "https://api.example.com:8443/prefix");
    let bare: BaseUrl = "http://127.0.0.1:9000".parse().expect("a URL");
    assert_eq!(
        bare.join("/v2/usage", None).map(|u| u.to_string()).as_deref(),
        Some("http://127.0.0.1:9000/v2/usage")
    );
    assert_eq!(bare.join("/v2/x y", None), None, "not a URI path: not forwarded");
    for (value, says) in [
        ("\"ftp://x\"", "upstream.base_url: \"ftp://x\" is not an http(s) URL"),
        (
            "\"api.example.com\"",
            "upstream.base_url: \"api.example.com\" is not an http(s) URL",
        ),
        ("\"https://h/?a=1\"", "upstream.base_url: must not have a query"),
        (
            "5",
            "upstream.base_url: 5 is not allowed here: expected an http(s) URL like https://api.example.com",
        ),
    ] {
        let errs = problems(&format!("base_url = {value}\n"));
        assert_eq!(errs, [says], "{value}");
    }
}

#[test]
fn token_hashes_are_read_as_their_bytes_and_printed_back_as_hex() {
    let upper = TokenHash::of("a-token").to_string().to_ascii_uppercase();
    let c = load(&format!(
        "{KEY}[[teams]]\nname = \"a\"\ntoken_sha256 = \"{upper}\"\n[admin]\ntoken_sha256 = \"{}\"\n",
        TokenHash::of("admin-token")
    ))
    .expect("valid");
    assert_eq!(c.teams[0].token_sha256, Some(TokenHash::of("a-token")));
    assert_eq!(c.admin.token_sha256, Some(TokenHash::of("admin-token")));
    let printed = c.redacted_toml();
    assert!(
        printed.contains(&format!("token_sha256 = \"{}\"", upper.to_ascii_lowercase())),
        "{printed}"
    );
    for (value, says) in [
        ("\"abc\"", "must be 64 hex characters (the SHA-256 of the token, see `permit-gateway token`)"),
        (
            &format!("\"{}\"", "g".repeat(64)),
            "must be 64 hex characters (the SHA-256 of the token, see `permit-gateway token`)",
        ),
        (
            "5",
            "5 is not allowed here: expected 64 hex characters in quotes (the SHA-256 of the token, see `permit-gateway token`)",
        ),
    ] {
        let errs = problems(&format!("[admin]\ntoken_sha256 = {value}\nmetrics_auth = true\n"));
        // The hash is set, if badly: no second complaint that it is missing.
        assert_eq!(errs, [format!("admin.token_sha256: {says}")], "{value}");
    }
}

#[test]
fn a_bad_or_missing_team_hash_does_not_hide_the_teams_other_problems() {
    let errs = problems(
        "[[teams]]\nname = \"a\"\ntoken_sha256 = \"abc\"\n[[teams]]\nname = \"b\"\ntoken_sha256 = \"xyz\"\n\
         [[teams]]\nname = \"Bad\"\nrequests_per_minute = 0\n",
    );
    let mut want = vec![
        "teams[0].token_sha256: must be 64 hex characters (the SHA-256 of the token, see `permit-gateway token`)",
        "teams[1].token_sha256: must be 64 hex characters (the SHA-256 of the token, see `permit-gateway token`)",
        "teams[2].token_sha256: team \"Bad\": has no token: set token_sha256 or give it [[teams.tokens]]",
        "teams[2].name: team \"Bad\": must be 1-64 of [a-z0-9_-]",
        "teams[2].requests_per_minute: team \"Bad\": must be positive (omit for no limit)",
    ];
    // Two bad hashes are no "same token" either.
    want.sort();
    let mut errs = errs;
    errs.sort();
    assert_eq!(errs, want);
}

#[test]
fn a_hash_matches_only_its_own_digest() {
    let a = TokenHash::from([7u8; 32]);
    assert!(bool::from(a.matches(&[7u8; 32])));
    for i in 0..32 {
        let mut b = [7u8; 32];
        b[i] ^= 0x80;
        assert!(!bool::from(a.matches(&b)), "byte {i}");
    }
}

#[test]
fn route_ttls_are_keyed_by_route_and_an_unknown_name_lists_the_routes() {
    let errs = problems("[cache.route_ttl_secs]\npermit_search = 5\nlist_tags = 5\nbogus = 1\nusage = 5\n");
    assert_eq!(errs.len(), 3, "{errs:#?}");
    for name in ["permit_search", "bogus"] {
        let at = format!("cache.route_ttl_secs.{name}: {name:?} is not one of `permits_search`, ");
        let e = errs
            .iter()
            .find(|e| e.starts_with(&at))
            .unwrap_or_else(|| panic!("{at}: {errs:#?}"));
        for route in crate::route::Route::ALL {
            assert!(e.contains(&format!("`{}`", route.as_str())), "{e}");
        }
    }
    assert!(errs.contains(&"cache.route_ttl_secs.usage: /v2/usage is never cached".to_string()));
    let c = load(&format!("{KEY}[cache.route_ttl_secs]\nlist_tags = 5\n")).expect("valid");
    assert!(
        c.redacted_toml().contains("[cache.route_ttl_secs]\nlist_tags = 5\n"),
        "{}",
        c.redacted_toml()
    );
}

#[test]
fn the_log_level_is_a_level_or_a_filter_and_a_typo_is_refused() {
    use tracing::Level;
    for ok in [
        "info",
        "DEBUG",
        "off",
        "info,access=warn",
        "warn,permit_gateway::proxy=trace",
    ] {
        let c = load(&format!("{KEY}[log]\nlevel = {ok:?}\n")).unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert_eq!(c.log.level.to_string(), ok, "printed back as written");
    }
    for bad in ["inof", "", "info,permit_gateway=loud", "verbose,access=warn"] {
        let errs = problems(&format!("[log]\nlevel = {bad:?}\n"));
        assert_eq!(
            errs,
            [format!(
                "log.level: {bad:?} is not a level (off, error, warn, info, debug or trace) or a filter like \"info,permit_gateway=debug\""
            )]
        );
    }
    // The filter built from the parsed directives is the one tracing reads.
    let level: LogLevel = "info,access=warn".parse().expect("a filter");
    let subscriber = tracing_subscriber::layer::SubscriberExt::with(
        tracing_subscriber::registry(),
        tracing_subscriber::Layer::with_filter(
            tracing_subscriber::fmt::layer().with_writer(std::io::sink),
            level.filter(),
        ),
    );
    tracing::subscriber::with_default(subscriber, || {
        assert!(tracing::enabled!(Level::INFO));
        assert!(!tracing::enabled!(Level::DEBUG));
        assert!(!tracing::enabled!(target: "access", Level::INFO));
        assert!(tracing::enabled!(target: "access", Level::WARN));
    });
    let info = LogLevel::from(tracing::level_filters::LevelFilter::INFO);
    assert_eq!(info, "info".parse().expect("a level"));
}

#[test]
fn the_printed_config_loads_back_as_the_same_config() {
    let text = format!(
        "{KEY}base_url = \"http://10.0.0.1:8080/api\"\n[[teams]]\nname = \"a\"\ntoken_sha256 = \"{}\"\n\
         [cache.route_ttl_secs]\npermits_search = 60\nother = 0\n[log]\nlevel = \"debug,access=warn\"\n",
        TokenHash::of("a-token")
    );
    let c = load(&text).expect("valid");
    let again = load(&c.redacted_toml()).expect("the printout is a valid config");
    assert_eq!(serde_json::to_value(&c).ok(), serde_json::to_value(&again).ok());
    // The key prints redacted, so it reads back as another key.
    assert_eq!(c.restart_required(&again), ["upstream.api_key"]);
}

#[test]
fn the_per_core_runtime_is_opt_in_and_its_thread_count_bounded() {
    let c = load(KEY).expect("defaults");
    assert_eq!(c.server.runtime, Runtime::MultiThread);
    let c = load(&format!(
        "{KEY}[server]\nruntime = \"per_core\"\nper_core_threads = 3\n"
    ))
    .expect("per_core");
    assert_eq!(c.server.runtime, Runtime::PerCore);
    assert_eq!(c.server.per_core_loops(), 3);
    let errs = load(&format!("{KEY}[server]\nper_core_threads = 5000\n"))
        .expect_err("too many")
        .0;
    assert!(
        errs.iter().any(|e| e.starts_with("server.per_core_threads")),
        "{errs:#?}"
    );
}

#[test]
fn team_problems_name_the_team_and_a_duplicate_names_the_other_one() {
    let hash = "a".repeat(64);
    let text = format!(
        "{KEY}[[teams]]\nname = \"growth\"\ntoken_sha256 = \"{hash}\"\n\
         [[teams]]\nname = \"analytics\"\ntoken_sha256 = \"{hash}\"\n\
         [[teams]]\nname = \"growth\"\ntoken_sha256 = \"{}\"\n\
         [[teams]]\nname = \"unauthenticated\"\ntoken_sha256 = \"{}\"\n",
        "b".repeat(64),
        "c".repeat(64)
    );
    let errs = load(&text).expect_err("invalid").0;
    for want in [
        "teams[1].token_sha256: team \"analytics\": the same token is given to teams[0] \"growth\"",
        "teams[2].name: team \"growth\": teams[0] has the same name",
        "teams[3].name: team \"unauthenticated\": reserved",
    ] {
        assert!(errs.iter().any(|e| e.starts_with(want)), "{want}: {errs:#?}");
    }
    let other = format!("{KEY}[[teams]]\nname = \"other\"\ntoken_sha256 = \"{hash}\"\n");
    assert!(load(&other).is_err(), "`other` is a label value too");
}

#[test]
fn a_misspelt_key_gets_the_nearest_valid_one() {
    let text = format!(
        "{KEY}[cache]\nmemory_max_byte = 1\n[quota]\ncredit_limt = 5\n[[teams]]\nname = \"a\"\ntoken_sha256 = \"{}\"\ncredit_limt = 5\n[server]\nzzz = 1\n",
        "a".repeat(64)
    );
    let errs = load(&text).expect_err("unknown keys").0;
    for want in [
        "cache.memory_max_byte: unknown key (did you mean `memory_max_bytes`?)",
        "teams[0].credit_limt: unknown key (did you mean `credit_limit`?)",
        "server.zzz: unknown key",
    ] {
        assert!(errs.iter().any(|e| e == want), "{want}: {errs:#?}");
    }
}

#[test]
fn a_config_without_teams_warns_where_it_came_from() {
    let config = load(KEY).expect("valid");
    assert!(!config.teams_declared());
    let warning = config
        .warnings()
        .iter()
        .find(|w| w.starts_with("teams:"))
        .expect("a warning");
    assert!(
        warning.contains("every team request will be refused with 401"),
        "{warning}"
    );
    assert!(warning.contains(config.origin()), "{warning}");
    let on_purpose = load(&format!("teams = []\n{KEY}")).expect("valid");
    assert!(on_purpose.teams_declared(), "`teams = []` is written on purpose");
}

#[test]
fn a_redis_url_is_shown_without_its_password() {
    let url = |u: &str| Secret::new(u).url_redacted();
    assert_eq!(url("redis://cache.internal:6379/2"), "redis://cache.internal:6379/2");
    assert_eq!(url("redis://:hunter2@cache:6379"), "redis://:<redacted>@cache:6379");
    assert_eq!(
        url("rediss://gateway:hunter2@a:1,b:2/0"),
        "rediss://gateway:<redacted>@a:1,b:2/0"
    );
    assert_eq!(
        url("redis+sentinel://user@s1:26379/mymaster"),
        "redis+sentinel://user@s1:26379/mymaster"
    );
    assert_eq!(url("not a url hunter2"), "<redacted>");
    let text = format!("{KEY}[cache]\nredis_url = \"redis://:hunter2@cache:6379/1\"\n");
    let shown = load(&text).expect("valid").redacted_toml();
    assert!(shown.contains("redis://:<redacted>@cache:6379/1"), "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
}

#[test]
fn app_tokens_are_checked_naming_the_team_and_the_app() {
    let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
    let ok = format!(
        "{KEY}[quota]\norg_credit_limit = 900\n\
         [[teams]]\nname = \"growth\"\ncredit_limit = 100\n\
         [[teams.tokens]]\nname = \"web\"\ntoken_sha256 = \"{a}\"\nnot_after = \"2026-12-31T00:00:00Z\"\ncredit_limit = 40\n\
         [[teams.tokens]]\nname = \"batch\"\ntoken_sha256 = \"{b}\"\n"
    );
    let config = load(&ok).expect("a team of two apps, no token_sha256");
    let apps: Vec<String> = config.teams[0].apps().map(|a| a.name).collect();
    assert_eq!(apps, ["web", "batch"]);
    assert_eq!(config.quota.org_credit_limit, Some(900));
    assert!(config.teams[0].tokens[0].not_after.is_some());
    let bad = format!(
        "{KEY}[[teams]]\nname = \"growth\"\ntoken_sha256 = \"{a}\"\ncredit_limit = 10\n\
         [[teams.tokens]]\nname = \"default\"\ntoken_sha256 = \"{b}\"\n\
         [[teams.tokens]]\nname = \"Web\"\ntoken_sha256 = \"{c}\"\ncredit_limit = 11\n\
         [[teams.tokens]]\nname = \"api\"\ntoken_sha256 = \"{c}\"\nnot_afer = \"2026-12-31T00:00:00Z\"\n\
         [[teams]]\nname = \"ops\"\n"
    );
    let errs = load(&bad).expect_err("invalid").0;
    for want in [
        "teams[0].tokens[0].name: team \"growth\", app \"default\": the team's token_sha256 is its app \"default\" already",
        "teams[0].tokens[1].name: team \"growth\", app \"Web\": must be 1-64 of [a-z0-9_-]",
        "teams[0].tokens[1].credit_limit: team \"growth\", app \"Web\": 11 is above the team's credit_limit (10)",
        "teams[0].tokens[2].token_sha256: team \"growth\", app \"api\": the same token is given to teams[0] \"growth\", app \"Web\"",
        "teams[0].tokens[2].not_afer: unknown key (did you mean `not_after`?)",
        "teams[1].token_sha256: team \"ops\": has no token",
    ] {
        assert!(errs.iter().any(|e| e.starts_with(want)), "{want}: {errs:#?}");
    }
}
