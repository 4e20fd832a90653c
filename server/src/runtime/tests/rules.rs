//! The runtime's pure rules: the backoff, which units are a group's member, how times are written.

use super::*;
use crate::runtime::conductor::is_member;

#[test]
fn the_backoff_doubles_up_to_its_cap() {
    let settings = Settings {
        backoff_max: Duration::from_secs(10),
        ..Settings::new(PathBuf::new(), PathBuf::new())
    };
    let waits: Vec<u64> = (1..=6).map(|n| settings.backoff(n).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
}

#[test]
fn a_unit_is_a_member_of_its_group_on_any_machine() {
    assert!(is_member(
        "group:text-router/glm@atlas",
        Some("text-router"),
        "glm"
    ));
    assert!(is_member("group:other/glm@atlas", None, "glm"));
    assert!(!is_member(
        "group:other/glm@atlas",
        Some("text-router"),
        "glm"
    ));
    assert!(!is_member("glm", None, "glm"));
    assert_eq!(
        engine_id("group:text-router/glm@atlas"),
        "group~text-router~glm~atlas"
    );
}

#[test]
fn times_are_written_in_rfc_3339() {
    let t = now();
    assert!(
        time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).is_ok(),
        "{t}"
    );
    assert!(t.ends_with('Z'), "{t}");
}
