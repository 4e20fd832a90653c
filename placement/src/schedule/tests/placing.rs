//! Best fit for new work: the fullest GPU that fits, ties, shared against whole, filters and ids, several
//! GPUs, and what a machine's cores and memory allow.

use super::*;
use crate::testing::{machine, majin};

#[test]
fn shared_work_beside_six_and_a_half_gb_on_majin_waits_with_the_seed_reason() {
    let mut s = fleet(vec![majin()]);
    placed(s.place("listen", &shared(2.2)));
    placed(s.place("voice", &shared(4.3)));
    assert_eq!(
        waits(s.place("notebook", &shared(1.5))),
        ["GPU 0 of majin: 6.5 of 7 GB taken by shared work; it needs 1.5"]
    );
}

#[test]
fn a_worker_larger_than_what_majin_offers_waits_with_the_seed_reason() {
    let mut s = fleet(vec![majin()]);
    assert_eq!(
        waits(s.place("big", &shared(7.5))),
        ["GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Tessera); it needs 7.5"]
    );
}

#[test]
fn shared_work_fits_up_to_exactly_what_the_gpu_offers() {
    let mut s = fleet(vec![majin()]);
    placed(s.place("a", &shared(3.5)));
    let b = placed(s.place("b", &shared(3.5)));
    assert_eq!(b.gpus, [0]);
    assert_eq!(
        s.hold(&GpuRef::new("majin", 0)).unwrap().taken(),
        Bytes::gb(7)
    );
}

#[test]
fn the_fullest_gpu_that_fits_is_chosen() {
    let mut s = fleet(vec![machine("node", &[24, 24, 24])]);
    placed(s.place("a", &shared(10.0))); // GPU 0 (all empty: lowest index)
    placed(s.place("b", &shared(4.0))); // GPU 0, fullest
    let c = placed(s.place("c", &shared(12.0))); // 10 left on GPU 0: does not fit; GPU 1
    assert_eq!(c.gpus, [1]);
    let d = placed(s.place("d", &shared(9.0))); // 10 left on GPU 0, 12 on GPU 1: GPU 0 is fuller
    assert_eq!(d.gpus, [0]);
}

#[test]
fn ties_are_broken_by_machine_name_then_gpu_index() {
    let mut s = fleet(vec![machine("zeta", &[16]), machine("alpha", &[16, 16])]);
    let a = placed(s.place("a", &shared(4.0)));
    assert_eq!((a.machine.as_str(), a.gpus.as_slice()), ("alpha", &[0][..]));
    let mut s = fleet(vec![machine("zeta", &[16]), machine("alpha", &[8, 16])]);
    let b = placed(s.place("b", &shared(4.0)));
    assert_eq!(
        (b.machine.as_str(), b.gpus.as_slice()),
        ("alpha", &[0][..]),
        "the smaller GPU is the better fit"
    );
}

#[test]
fn whole_work_does_not_land_on_a_shared_gpu_and_shared_work_not_on_a_whole_one() {
    let mut s = fleet(vec![machine("node", &[24])]);
    placed(s.place("sharer", &shared(2.0)));
    assert_eq!(
        waits(s.place("trainer", &request(r#"{"gpu_requests": {"count": 1}}"#))),
        ["GPU 0 of node is shared by 1 worker; it needs a whole GPU"]
    );
    s.release("sharer").unwrap();
    assert_eq!(
        s.hold(&GpuRef::new("node", 0)),
        Some(&Hold::Free),
        "whole again once the last sharer ends"
    );
    placed(s.place("trainer", &request(r#"{"gpu_requests": {"count": 1}}"#)));
    assert_eq!(
        waits(s.place("sharer", &shared(2.0))),
        ["GPU 0 of node is held whole by trainer"]
    );
}

#[test]
fn a_sharers_memory_is_free_for_the_next_when_it_ends() {
    let mut s = fleet(vec![majin()]);
    placed(s.place("a", &shared(5.0)));
    waits(s.place("b", &shared(4.0)));
    let released = s.release("a").unwrap();
    assert_eq!(released.shared, Some(Bytes::gb(5)));
    placed(s.place("b", &shared(4.0)));
    assert_eq!(s.release("nobody"), None);
}

#[test]
fn on_a_wsl2_pc_shared_work_takes_its_memory_on_every_gpu() {
    let mut pc = machine("desk", &[12, 8]);
    pc.all_gpus_visible = true;
    let mut s = fleet(vec![pc]);
    let a = placed(s.place("a", &shared(6.0)));
    assert_eq!(a.gpus, [0, 1]);
    assert_eq!(
        s.hold(&GpuRef::new("desk", 1)).unwrap().taken(),
        Bytes::gb(6)
    );
    assert_eq!(
        waits(s.place("b", &shared(3.0))),
        ["GPU 1 of desk: 6 of 8 GB taken by shared work; it needs 3"]
    );
}

#[test]
fn the_machines_cpu_cores_and_memory_must_fit_too() {
    let mut s = fleet(vec![majin()]);
    let greedy = request(
        r#"{"cpu_cores": 12, "memory_bytes": 34359738368, "gpu_requests": {"shared": true, "memory_gb": 1}}"#,
    );
    placed(s.place("a", &greedy));
    assert_eq!(
        waits(s.place("b", &greedy)),
        ["majin has 4 of its 16 CPU cores free; it needs 12"]
    );
    let memory = request(
        r#"{"memory_bytes": 42949672960, "gpu_requests": {"shared": true, "memory_gb": 1}}"#,
    );
    assert_eq!(
        waits(s.place("c", &memory)),
        ["majin has 32 of its 64 GB of memory free; it needs 40"]
    );
    assert_eq!(s.machine_use("majin"), Some((12, Bytes::gb(32))));
}

#[test]
fn vendor_model_and_health_filters_say_why_a_gpu_is_left_out() {
    let mut node = machine("node", &[24, 24, 24]);
    node.gpus[1].healthy = false;
    node.gpus[2].model = "NVIDIA H200".into();
    let mut s = fleet(vec![node]);
    let amd = request(r#"{"gpu_requests": {"shared": true, "memory_gb": 1, "vendor": "amd"}}"#);
    assert_eq!(
        waits(s.place("a", &amd))[0],
        "GPU 0 of node is made by nvidia; it needs amd"
    );
    let h200 =
        request(r#"{"gpu_requests": {"shared": true, "memory_gb": 1, "models": ["NVIDIA H200"]}}"#);
    assert_eq!(placed(s.place("b", &h200)).gpus, [2]);
    let h100 =
        request(r#"{"gpu_requests": {"shared": true, "memory_gb": 1, "models": ["NVIDIA H100"]}}"#);
    assert_eq!(
        waits(s.place("c", &h100)),
        [
            "GPU 0 of node is a NVIDIA GeForce RTX 4060; it needs NVIDIA H100",
            "GPU 1 of node is unhealthy",
            "GPU 2 of node is a NVIDIA H200; it needs NVIDIA H100"
        ]
    );
    let sick_ok =
        request(r#"{"gpu_requests": {"count": 1, "healthy_only": false, "ids": ["node:1"]}}"#);
    assert_eq!(placed(s.place("d", &sick_ok)).gpus, [1]);
}

#[test]
fn ids_pick_the_gpus_by_uuid_or_machine_and_index() {
    let mut s = fleet(vec![machine("node", &[24, 24, 24])]);
    let by_uuid =
        request(r#"{"gpu_requests": {"shared": true, "memory_gb": 1, "ids": ["GPU-2"]}}"#);
    assert_eq!(placed(s.place("a", &by_uuid)).gpus, [2]);
    let nowhere =
        request(r#"{"gpu_requests": {"shared": true, "memory_gb": 1, "ids": ["other:0"]}}"#);
    assert_eq!(
        waits(s.place("b", &nowhere)),
        ["no GPU matches the vendor, models and ids asked for"]
    );
}

#[test]
fn several_gpus_come_from_one_machine() {
    let mut s = fleet(vec![machine("small", &[24]), machine("big", &[24, 24, 24])]);
    let two = request(r#"{"gpu_requests": {"count": 2, "shared": true, "memory_gb": 20}}"#);
    let a = placed(s.place("a", &two));
    assert_eq!(
        (a.machine.as_str(), a.gpus.as_slice()),
        ("big", &[0, 1][..])
    );
    let b = placed(s.place("b", &request(r#"{"gpu_requests": {"count": 1}}"#)));
    assert_eq!(b.machine, "big", "{b:?}");
    let c = waits(s.place("c", &two));
    assert!(
        c.contains(&"small: 1 GPU fits; it needs 2".to_owned()),
        "{c:?}"
    );
}

#[test]
fn policy_all_takes_every_gpu_of_a_machine_whole() {
    let mut s = fleet(vec![machine("one", &[24]), machine("two", &[24, 24])]);
    placed(s.place("x", &shared(1.0)));
    let all = placed(s.place("all", &request(r#"{"gpu_requests": {"policy": "All"}}"#)));
    assert_eq!(
        (all.machine.as_str(), all.gpus.as_slice()),
        ("two", &[0, 1][..])
    );
}

#[test]
fn whole_gpus_go_to_the_machine_left_with_the_fewest_free() {
    let mut s = fleet(vec![machine("a", &[24, 24, 24]), machine("b", &[24, 24])]);
    let one = request(r#"{"gpu_requests": {"count": 1}}"#);
    assert_eq!(placed(s.place("w1", &one)).machine, "b");
    assert_eq!(placed(s.place("w2", &one)).machine, "b");
    assert_eq!(placed(s.place("w3", &one)).machine, "a");
}

#[test]
fn a_worker_without_gpus_needs_only_cores_and_memory() {
    let mut s = fleet(vec![majin()]);
    let a = placed(s.place("cpu", &request(r#"{"cpu_cores": 4}"#)));
    assert!(a.gpus.is_empty());
    assert_eq!(
        waits(s.place("cpu2", &request(r#"{"cpu_cores": 13}"#))),
        ["majin has 12 of its 16 CPU cores free; it needs 13"]
    );
}

#[test]
fn a_name_is_placed_once_and_a_restored_assignment_must_still_fit() {
    let mut s = fleet(vec![majin()]);
    placed(s.place("a", &shared(5.0)));
    assert_eq!(
        s.place("a", &shared(1.0)),
        Err(ScheduleError::AlreadyPlaced("a".into()))
    );
    let too_big = Assignment {
        machine: "majin".into(),
        gpus: vec![0],
        shared: Some(Bytes::gb(3)),
        cpu_cores: 0,
        memory: Bytes::ZERO,
    };
    assert!(matches!(
        s.hold_for("b", too_big.clone()),
        Err(ScheduleError::DoesNotFit(_))
    ));
    let elsewhere = Assignment {
        machine: "nowhere".into(),
        ..too_big
    };
    assert_eq!(
        s.hold_for("c", elsewhere),
        Err(ScheduleError::Unknown("nowhere".into()))
    );
    assert_eq!(s.workers().len(), 1, "nothing half-held after a refusal");
}
