//! The runtime's pure rules: the backoff, which units are a group's member, how times are written.

use super::*;
use crate::runtime::conductor::{is_member, Gpu, Within};

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

/// A unit registered as `name` on `machine`, in no state worth reading.
fn unit(name: &str, machine: &str) -> engines::Unit {
    let mut spec = command(name, 0, "true");
    spec.machine = machine.to_owned();
    engines::Unit {
        spec,
        status: tokio::sync::watch::channel(engines::Status {
            state: EngineState::Stopped,
            since: String::new(),
            pid: None,
            port: None,
            restarts: 0,
            message: None,
            launch: None,
            api_key: None,
            reported: Vec::new(),
            asleep: None,
            last_wake: None,
            sleep_failed: None,
        })
        .0,
        control: None,
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, ..Default::default() })]
    /// Each step registers a unit (a worker, or a member of a group on a machine; a worker may come back
    /// on another machine) or forgets one; after each, the index answers as a walk through every unit.
    #[test]
    fn a_name_s_engines_and_a_machine_s_are_those_a_walk_through_every_engine_finds(
        steps in proptest::collection::vec((0..3u8, 0..3usize, 0..3usize, 0..3usize), 1..40),
    ) {
        let names = ["glm", "qwen", "whisper"];
        let machines = ["atlas", "boreas", "ceto"];
        let mut units = engines::Units::default();
        for (kind, name, group, machine) in steps {
            let (name, machine) = (names[name], machines[machine]);
            let unit_name = match kind {
                0 => name.to_owned(),
                _ => placement::holder::member(&format!("g{group}"), name, machine),
            };
            if kind == 2 {
                units.remove(&unit_name);
            } else {
                units.insert(unit(&unit_name, machine));
            }
            for key in names.iter().chain(&machines) {
                let found = |walked: Vec<&str>, indexed: Vec<&str>| {
                    proptest::prop_assert_eq!(walked, indexed, "{}", key);
                    Ok(())
                };
                found(
                    units.keys().map(String::as_str).filter(|u| placement::holder::Holder::parse(u).name() == *key).collect(),
                    units.named(key).map(|(u, _)| u).collect(),
                )?;
                found(
                    units.iter().filter(|(_, u)| u.spec.machine == *key).map(|(u, _)| u.as_str()).collect(),
                    units.on_machine(key).map(|(u, _)| u).collect(),
                )?;
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, ..Default::default() })]
    /// A job finds the engines it may have to stop by look-up: on some GPUs (through their machines), a
    /// unit, a group's. Those found are the ones a walk through every engine finds.
    #[test]
    fn the_engines_a_job_may_stop_are_those_a_walk_through_every_engine_finds(
        engines in proptest::collection::vec((0..4usize, 0..3usize, proptest::collection::vec(0..4u32, 0..3)), 0..30),
        within_gpus in proptest::collection::btree_set((0..3usize, 0..4u32), 0..5),
        pick in 0..4usize,
    ) {
        let machines = ["atlas", "boreas", "ceto"];
        let mut units = engines::Units::default();
        for (i, (group, machine, gpus)) in engines.iter().enumerate() {
            let machine = machines[*machine];
            let name = match group {
                0 => format!("w{i}"),
                g => placement::holder::member(&format!("g{g}"), &format!("m{i}"), machine),
            };
            let mut unit = unit(&name, machine);
            unit.spec.gpus = gpus.clone();
            units.insert(unit);
        }
        let scopes = [
            Within::Gpus(within_gpus.iter().map(|&(m, g)| Gpu::of(machines[m], g)).collect()),
            Within::Units([format!("w{pick}"), format!("w{}", pick + 1)].into()),
            Within::Group(placement::holder::group_prefix(&format!("g{pick}"))),
        ];
        for within in &scopes {
            let mut found: Vec<&str> = within.registered(&units).map(|(u, _)| u).collect();
            found.sort();
            let walked: Vec<&str> = units.iter().filter(|(_, u)| within.holds(&u.spec)).map(|(u, _)| u.as_str()).collect();
            proptest::prop_assert_eq!(found, walked);
        }
    }
}
