//! Committed holds restored as they were, even past what a GPU now offers: kept, reported as over-commits,
//! and never added to.

use super::*;
use crate::testing::{machine, majin};

/// Majin after its desktop came to hold 3 GB (it offers 5 of its 8), with 2.2 + 4.3 GB committed before.
fn overcommitted_majin() -> Scheduler {
    let mut m = majin();
    m.gpus[0].held_outside = Bytes::gb(3);
    let mut s = fleet(vec![m, machine("spare", &[8])]);
    s.hold_committed("listen", shared_on("majin", 0, 2.2))
        .unwrap();
    s.hold_committed("voice", shared_on("majin", 0, 4.3))
        .unwrap();
    s
}

#[test]
fn a_committed_hold_past_what_a_gpu_offers_is_kept_and_reported() {
    let mut s = overcommitted_majin();
    let gpu = GpuRef::new("majin", 0);
    assert_eq!(
        s.hold(&gpu).unwrap().taken(),
        Bytes::from_gb(2.2).unwrap() + Bytes::from_gb(4.3).unwrap()
    );
    let over = s.overcommitted();
    assert_eq!(over.len(), 1, "{over:?}");
    assert_eq!(over[0].gpu, gpu);
    assert_eq!(over[0].offered(), Bytes::gb(5));
    assert_eq!(over[0].over().gb_text(), "1.5");
    assert_eq!(
        over[0].to_string(),
        "GPU 0 of majin offers 5 of its 8 GB (3 GB held outside Tessera) but its sharers take 6.5 GB: 1.5 GB over"
    );
    assert!(
        matches!(
            s.hold_for("again", shared_on("majin", 0, 0.1)),
            Err(ScheduleError::DoesNotFit(PendingReason::SharedFull { .. }))
        ),
        "hold_for still checks that it fits"
    );
}

#[test]
fn an_over_commit_is_told_in_the_seeds_words() {
    let over = Overcommit {
        gpu: GpuRef::new("node", 1),
        total: Bytes::gb(24),
        held_outside: Bytes::ZERO,
        taken: Bytes::gb(25),
    };
    assert_eq!(
        over.to_string(),
        "GPU 1 of node offers all of its 24 GB but its sharers take 25 GB: 1 GB over"
    );
    assert_eq!(over.over(), Bytes::gb(1));
}

#[test]
fn nothing_new_is_placed_on_an_over_committed_gpu() {
    let mut s = overcommitted_majin();
    let only_majin = |json: &str| {
        let mut r = request(json);
        r.gpus.as_mut().unwrap().ids = vec!["majin:0".into()];
        r
    };
    for tenths in [1, 5, 30, 60] {
        let r = only_majin(&format!(
            r#"{{"gpu_requests": {{"shared": true, "memory_gb": {}}}}}"#,
            f64::from(tenths) / 10.0
        ));
        match s.decide(&r) {
            Decision::Wait(reasons) => assert!(!reasons.is_empty()),
            Decision::Place(a) => panic!("placed {a:?} on an over-committed GPU"),
        }
    }
    assert_eq!(
        waits(s.place(
            "tiny",
            &only_majin(r#"{"gpu_requests": {"shared": true, "memory_gb": 0.1}}"#)
        )),
        ["GPU 0 of majin: 6.5 of 5 GB taken by shared work; it needs 0.1"]
    );
    assert_eq!(
        waits(s.place("trainer", &only_majin(r#"{"gpu_requests": {"count": 1}}"#))),
        ["GPU 0 of majin is shared by 2 workers; it needs a whole GPU"]
    );
    let elsewhere = placed(s.place("small", &shared(0.1)));
    assert_eq!(
        elsewhere.machine, "spare",
        "best fit passes over the over-committed GPU"
    );
    assert_eq!(s.overcommitted().len(), 1);
}

#[test]
fn a_committed_hold_refuses_only_what_cannot_be_held_at_all() {
    let mut s = fleet(vec![machine("node", &[24, 24])]);
    s.hold_committed("sharer", shared_on("node", 0, 2.0))
        .unwrap();
    let whole = |index| Assignment {
        shared: None,
        ..shared_on("node", index, 0.0)
    };
    s.hold_committed("trainer", whole(1)).unwrap();
    assert_eq!(
        s.hold_committed("other", whole(0)),
        Err(ScheduleError::DoesNotFit(PendingReason::Shared {
            gpu: GpuRef::new("node", 0),
            sharers: 1
        }))
    );
    assert_eq!(
        s.hold_committed("other", shared_on("node", 1, 1.0)),
        Err(ScheduleError::DoesNotFit(PendingReason::HeldWhole {
            gpu: GpuRef::new("node", 1),
            by: "trainer".into()
        }))
    );
    let unknown_gpu = Assignment {
        gpus: vec![0, 3],
        ..shared_on("node", 0, 1.0)
    };
    assert_eq!(
        s.hold_committed("other", unknown_gpu)
            .unwrap_err()
            .to_string(),
        "GPU 3 of node is not in the inventory"
    );
    assert_eq!(
        s.hold_committed("other", shared_on("nowhere", 0, 1.0)),
        Err(ScheduleError::Unknown("nowhere".into()))
    );
    assert_eq!(
        s.hold_committed("sharer", shared_on("node", 0, 1.0)),
        Err(ScheduleError::AlreadyPlaced("sharer".into()))
    );
    assert_eq!(s.workers().len(), 2, "nothing half-held after a refusal");
    assert_eq!(
        s.hold(&GpuRef::new("node", 0)).unwrap().taken(),
        Bytes::gb(2)
    );
}

#[test]
fn a_committed_hold_past_the_machines_cores_and_memory_is_kept() {
    let mut s = fleet(vec![majin()]);
    let greedy = Assignment {
        machine: "majin".into(),
        gpus: Vec::new(),
        shared: None,
        cpu_cores: 20,
        memory: Bytes::gb(80),
    };
    s.hold_committed("greedy", greedy).unwrap();
    assert_eq!(s.machine_use("majin"), Some((20, Bytes::gb(80))));
    assert_eq!(
        waits(s.place("cpu", &request(r#"{"cpu_cores": 1}"#))),
        ["majin has 0 of its 16 CPU cores free; it needs 1"]
    );
    s.release("greedy").unwrap();
    assert_eq!(s.machine_use("majin"), Some((0, Bytes::ZERO)));
}

#[test]
fn a_gpu_listed_twice_in_an_assignment_is_held_once() {
    let mut s = fleet(vec![majin()]);
    let twice = Assignment {
        gpus: vec![0, 0],
        ..shared_on("majin", 0, 2.0)
    };
    s.hold_for("a", twice.clone()).unwrap();
    s.hold_committed("b", twice).unwrap();
    let gpu = GpuRef::new("majin", 0);
    assert_eq!(s.hold(&gpu).unwrap().taken(), Bytes::gb(4));
    s.release("a").unwrap();
    s.release("b").unwrap();
    assert_eq!(s.hold(&gpu), Some(&Hold::Free));
    placed(s.place("c", &shared(7.0)));
}

#[test]
fn releasing_the_newest_sharer_clears_the_over_commit() {
    let mut s = overcommitted_majin();
    s.release("voice").unwrap();
    assert_eq!(s.overcommitted(), []);
    let a = placed(s.place("notebook", &shared(2.8)));
    assert_eq!((a.machine.as_str(), a.gpus.as_slice()), ("majin", &[0][..]));
}

#[test]
fn a_new_reading_taken_in_place_decides_as_a_scheduler_built_anew_on_it() {
    let mut s = overcommitted_majin();
    let mut read = s.inventory().machine("majin").unwrap().clone();
    read.gpus[0].held_outside = Bytes::ZERO;
    assert!(s.read_again(&read));
    let mut anew = fleet(vec![read.clone(), machine("spare", &[8])]);
    for (who, assignment) in s.workers().clone() {
        anew.hold_committed(&who, assignment).unwrap();
    }
    assert_eq!(s.inventory(), anew.inventory());
    assert!(s.overcommitted().is_empty());
    for gb in [0.5, 1.4, 1.6, 7.0, 9.0] {
        assert_eq!(s.decide(&shared(gb)), anew.decide(&shared(gb)), "{gb} GB");
    }
    // A GPU that is another one now (its total changed) is no reading: the scheduler is built anew.
    read.gpus[0].total = Bytes::gb(16);
    assert!(!s.read_again(&read));
}
