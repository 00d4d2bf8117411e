//! `not_after`, a token's end (issue 59): the forms it is written in, the
//! error of one that is none of them, and the team's own.

use super::{load, KEY};
use crate::config::{Checks, Config, Source, DEFAULT_APP};

/// Issue 59: a `not_after` is written as operators write an end date: a
/// date (the start of that day, UTC), an RFC 3339 time, or a TOML date or
/// date-time (without an offset: UTC); on a team's own token too.
#[test]
fn not_after_takes_a_date_a_time_or_a_toml_date_on_a_team_and_its_apps() {
    let (a, b, c, d, e, f) = (
        "a".repeat(64),
        "b".repeat(64),
        "c".repeat(64),
        "d".repeat(64),
        "e".repeat(64),
        "f".repeat(64),
    );
    let text = format!(
        "{KEY}[[teams]]\nname = \"growth\"\ntoken_sha256 = \"{a}\"\nnot_after = \"2026-12-31\"\n\
         [[teams.tokens]]\nname = \"quoted\"\ntoken_sha256 = \"{b}\"\nnot_after = \"2026-12-31T00:00:00Z\"\n\
         [[teams.tokens]]\nname = \"offset\"\ntoken_sha256 = \"{c}\"\nnot_after = 2026-12-31T01:00:00+01:00\n\
         [[teams.tokens]]\nname = \"date\"\ntoken_sha256 = \"{d}\"\nnot_after = 2026-12-31\n\
         [[teams.tokens]]\nname = \"local\"\ntoken_sha256 = \"{e}\"\nnot_after = 2026-12-31T00:00:00\n\
         [[teams.tokens]]\nname = \"spaced\"\ntoken_sha256 = \"{f}\"\nnot_after = \"2026-12-31 00:00:00\"\n"
    );
    let config = load(&text).unwrap_or_else(|e| panic!("every form is a date: {e}"));
    let start_of_day: chrono::DateTime<chrono::Utc> = "2026-12-31T00:00:00Z".parse().expect("RFC 3339");
    let team = &config.teams[0];
    assert_eq!(team.not_after, Some(start_of_day), "the team's own token");
    for app in team.apps() {
        assert_eq!(app.not_after, Some(start_of_day), "app {}", app.name);
    }
    let default = team.apps().next().expect("the team's token_sha256");
    assert_eq!(default.name, DEFAULT_APP, "the team's not_after ends its app default");
    // Printed back as RFC 3339, which loads again as the same config.
    let shown = config.redacted_toml();
    assert!(shown.contains("not_after = \"2026-12-31T00:00:00Z\""), "{shown}");
    let again = Config::load_checked(Source::Text(&shown), Checks::without_secrets()).expect("printed config loads");
    assert_eq!(again.teams, config.teams);
}

#[test]
fn a_bad_not_after_names_the_forms_to_write() {
    let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
    let text = format!(
        "{KEY}[[teams]]\nname = \"growth\"\ntoken_sha256 = \"{a}\"\nnot_after = 5\n\
         [[teams.tokens]]\nname = \"web\"\ntoken_sha256 = \"{b}\"\nnot_after = \"2026-12-31T00:00:00Z\"\n\
         [[teams.tokens]]\nname = \"batch\"\ntoken_sha256 = \"{c}\"\nnot_after = \"31/12/2026\"\n\
         [[teams]]\nname = \"ops\"\ntoken_sha256 = \"{}\"\nnot_after = 07:30:00\n",
        "d".repeat(64)
    );
    let errs = load(&text).expect_err("three bad dates").0;
    for want in [
        "teams[0].tokens[1].not_after: \"31/12/2026\" is not a date: write 2026-12-31 or 2026-12-31T00:00:00Z",
        "teams[0].not_after: 5 is not allowed here: expected a date: write 2026-12-31 or 2026-12-31T00:00:00Z",
        "teams[1].not_after: \"07:30:00\" is not a date: write 2026-12-31 or 2026-12-31T00:00:00Z",
    ] {
        assert!(errs.iter().any(|e| e == want), "{want}: {errs:#?}");
    }
    assert_eq!(errs.len(), 3, "one problem each, the rest checked: {errs:#?}");
}

#[test]
fn a_teams_not_after_needs_its_token_sha256() {
    let text = format!(
        "{KEY}[[teams]]\nname = \"growth\"\nnot_after = \"2026-12-31\"\n\
         [[teams.tokens]]\nname = \"web\"\ntoken_sha256 = \"{}\"\n",
        "a".repeat(64)
    );
    let errs = load(&text).expect_err("nothing to end").0;
    assert_eq!(
        errs,
        [
            "teams[0].not_after: team \"growth\": ends the team's token_sha256, which is not set; \
          give an app's end as not_after in its [[teams.tokens]] entry"
        ]
    );
}
