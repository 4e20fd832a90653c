//! An engine unit's name, which is also what the scheduler holds a share under: made and parsed here, once.
//! The server's fleet makes them, its runtime reads them, and the console's repack page names who restarts
//! by them; here, below all three, none imports another for it.
//!
//! A worker's unit is the worker's own name; a group member's is `group:{group}/{member}@{machine}`, and a
//! replica's (a member that runs on one GPU of its group, as many times as its load asks) is
//! `group:{group}/{member}@{machine}:{index}`. Worker and machine names cannot contain `:`, `/` or `@`, so
//! none of these meet.

use crate::GpuRef;

/// The member name under which a group holds the room its on-demand members take turns in, beyond what
/// those loaded hold: not a model's name (those have no spaces), so no engine or usage is ever its.
pub const TURNS: &str = "on-demand turns";

/// The member name under which a group keeps a GPU of a machine where none of its members holds now (each
/// is a replica placed elsewhere): nothing, so that the GPU stays shared and no worker takes it whole while
/// the group's plan counts on it.
pub const REPLICA_ROOM: &str = "replica room";

/// Who holds a share, and whose engine a unit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder<'a> {
    /// A worker, by its name.
    Worker(&'a str),
    /// A member of a sharing group (its model's name) on one machine, or a replica of it on one GPU.
    Member {
        /// The group.
        group: &'a str,
        /// The member: its model's name, or [`TURNS`].
        member: &'a str,
        /// The machine it holds room on.
        machine: &'a str,
        /// A replica's GPU on that machine; none for a member that holds on each of the group's GPUs there.
        gpu: Option<u32>,
    },
}

impl<'a> Holder<'a> {
    /// The holder a unit name (or the scheduler's holder) stands for.
    pub fn parse(name: &'a str) -> Holder<'a> {
        name.strip_prefix("group:")
            .and_then(|rest| rest.split_once('/'))
            .and_then(|(group, rest)| {
                let (member, place) = rest.rsplit_once('@')?;
                let (machine, gpu) = match place.split_once(':') {
                    Some((machine, index)) => (machine, Some(index.parse().ok()?)),
                    None => (place, None),
                };
                Some(Holder::Member {
                    group,
                    member,
                    machine,
                    gpu,
                })
            })
            .unwrap_or(Holder::Worker(name))
    }

    /// The name a person knows it by: the worker's, or the member's model name.
    pub fn name(&self) -> &'a str {
        match *self {
            Holder::Worker(name) => name,
            Holder::Member { member, .. } => member,
        }
    }

    /// The group it is a member of, if any.
    pub fn group(&self) -> Option<&'a str> {
        match *self {
            Holder::Worker(_) => None,
            Holder::Member { group, .. } => Some(group),
        }
    }

    /// Whether it is room a group keeps that no engine allocates: where its on-demand members take turns
    /// ([`TURNS`]), or a GPU kept for replicas ([`REPLICA_ROOM`]).
    pub fn is_turns(&self) -> bool {
        matches!(
            self,
            Holder::Member {
                member: TURNS | REPLICA_ROOM,
                ..
            }
        )
    }
}

/// The unit name of `member` of `group` on `machine`.
pub fn member(group: &str, member: &str, machine: &str) -> String {
    format!("group:{group}/{member}@{machine}")
}

/// The unit name of a replica of `member` of `group` on `gpu` alone.
pub fn replica(group: &str, member: &str, gpu: &GpuRef) -> String {
    format!("group:{group}/{member}@{}:{}", gpu.machine, gpu.index)
}

/// What every unit name of `group`'s members begins with.
pub fn group_prefix(group: &str) -> String {
    format!("group:{group}/")
}

/// What every unit name of `member` of `group`, on any machine or GPU, begins with.
pub fn member_prefix(group: &str, member: &str) -> String {
    format!("group:{group}/{member}@")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_s_unit_name_parses_back_into_its_group_member_and_machine() {
        let name = member("chat", "qwen", "vega");
        assert_eq!(
            Holder::parse(&name),
            Holder::Member {
                group: "chat",
                member: "qwen",
                machine: "vega",
                gpu: None,
            }
        );
        assert!(name.starts_with(&group_prefix("chat")));
        assert!(name.starts_with(&member_prefix("chat", "qwen")));
        assert_eq!(Holder::parse(&name).name(), "qwen");
        assert_eq!(Holder::parse(&name).group(), Some("chat"));
    }

    #[test]
    fn a_replica_s_unit_name_parses_back_into_its_group_member_machine_and_gpu() {
        let name = replica("chat", "qwen", &GpuRef::new("vega", 3));
        assert_eq!(
            Holder::parse(&name),
            Holder::Member {
                group: "chat",
                member: "qwen",
                machine: "vega",
                gpu: Some(3),
            }
        );
        assert!(name.starts_with(&member_prefix("chat", "qwen")));
        assert_ne!(name, member("chat", "qwen", "vega"));
        assert_eq!(
            Holder::parse("group:chat/qwen@vega:x"),
            Holder::Worker("group:chat/qwen@vega:x")
        );
    }

    #[test]
    fn a_worker_s_unit_name_is_its_own_name() {
        assert_eq!(Holder::parse("scribe"), Holder::Worker("scribe"));
        assert_eq!(Holder::parse("scribe").group(), None);
        assert_eq!(
            Holder::parse("group:broken"),
            Holder::Worker("group:broken")
        );
    }

    #[test]
    fn the_turns_room_of_a_group_is_known_as_such() {
        assert!(Holder::parse(&member("chat", TURNS, "vega")).is_turns());
        assert!(Holder::parse(&member("chat", REPLICA_ROOM, "vega")).is_turns());
        assert!(!Holder::parse(&member("chat", "qwen", "vega")).is_turns());
    }
}
