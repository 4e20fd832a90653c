use super::*;
use crate::request::{GpuRequests, RequestedResources};
use crate::testing::{machine, majin};
use crate::units::GB;
use proptest::prelude::*;

fn fleet(machines: Vec<Machine>) -> Scheduler {
    Scheduler::new(Inventory::new(machines).unwrap())
}

fn shared(gb: f64) -> WorkerRequest {
    WorkerRequest::shared_gb(gb)
}

fn request(json: &str) -> WorkerRequest {
    let wire: RequestedResources = serde_json::from_str(json).unwrap();
    WorkerRequest::from_wire(&wire).unwrap()
}

fn placed(d: Result<Decision, ScheduleError>) -> Assignment {
    match d.unwrap() {
        Decision::Place(a) => a,
        Decision::Wait(r) => panic!("expected a placement, got {r:?}"),
    }
}

fn waits(d: Result<Decision, ScheduleError>) -> Vec<String> {
    match d.unwrap() {
        Decision::Wait(r) => r.iter().map(ToString::to_string).collect(),
        Decision::Place(a) => panic!("expected to wait, got {a:?}"),
    }
}

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

fn shared_on(machine: &str, index: u32, gb: f64) -> Assignment {
    Assignment {
        machine: machine.into(),
        gpus: vec![index],
        shared: Some(Bytes::from_gb(gb).unwrap()),
        cpu_cores: 0,
        memory: Bytes::ZERO,
    }
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

// ---- properties ----

fn fleet_strategy() -> impl Strategy<Value = Vec<Machine>> {
    let gpu_sizes = proptest::collection::vec((1u64..=16, 0u64..=2, any::<bool>()), 0..4);
    proptest::collection::vec((gpu_sizes, any::<bool>(), 4u32..=16), 1..5).prop_map(|machines| {
        machines
            .into_iter()
            .enumerate()
            .map(|(i, (gpus, wsl, cores))| {
                let sizes: Vec<u64> = gpus.iter().map(|g| g.0 * 4).collect();
                let mut m = machine(&format!("m{i}"), &sizes);
                m.all_gpus_visible = wsl && i % 3 == 0;
                m.cpu_cores = cores;
                for (g, (_, held, healthy)) in m.gpus.iter_mut().zip(gpus) {
                    g.held_outside = Bytes::gb(held).min(g.total);
                    g.healthy = healthy || held == 0;
                }
                m
            })
            .collect()
    })
}

#[derive(Debug, Clone)]
enum Op {
    Shared { tenths_gb: u64, cores: u32 },
    Whole { count: u32 },
    Release(usize),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..=400, 0u32..=4).prop_map(|(tenths_gb, cores)| Op::Shared { tenths_gb, cores }),
        1 => (1u32..=2).prop_map(|count| Op::Whole { count }),
        2 => any::<usize>().prop_map(Op::Release),
    ]
}

fn to_request(op: &Op) -> Option<WorkerRequest> {
    let wire = match *op {
        Op::Shared { tenths_gb, cores } => RequestedResources {
            cpu_cores: Some(f64::from(cores)),
            memory_bytes: None,
            gpu_requests: Some(GpuRequests {
                shared: true,
                memory_gb: Some(tenths_gb as f64 / 10.0),
                ..Default::default()
            }),
        },
        Op::Whole { count } => RequestedResources {
            gpu_requests: Some(GpuRequests {
                count: Some(f64::from(count)),
                ..Default::default()
            }),
            ..Default::default()
        },
        Op::Release(_) => return None,
    };
    Some(WorkerRequest::from_wire(&wire).unwrap())
}

/// The obviously-correct best fit for one shared GPU: weigh every GPU (every machine, for WSL2) from
/// scratch and keep the least memory left, then the machine name, then the GPU index.
fn oracle_single_shared(s: &Scheduler, request: &WorkerRequest) -> Option<(String, Vec<u32>)> {
    type Choice = (String, Vec<u32>);
    let need = request.shared_memory().unwrap();
    let mut best: Option<((u64, String, u32), Choice)> = None;
    for machine in s.inventory().machines() {
        let (cores, memory) = s.machine_use(&machine.name).unwrap();
        // What is free stops at zero: cores or memory held past the machine's (committed before) leave none.
        if request.cpu_cores > machine.cpu_cores.saturating_sub(cores)
            || request.memory > machine.memory.saturating_sub(memory)
        {
            continue;
        }
        let left = |g: &Gpu| -> Option<u64> {
            let hold = s.hold(&GpuRef::new(&machine.name, g.index)).unwrap();
            let usable = g.healthy && !matches!(hold, Hold::Whole(_));
            let taken = hold.taken();
            (usable && taken + need <= g.offered()).then(|| (g.offered() - taken - need).get())
        };
        let mut candidates: Vec<(u64, Vec<u32>)> = Vec::new();
        if machine.all_gpus_visible {
            let lefts: Option<Vec<u64>> = machine.gpus.iter().map(left).collect();
            if let (Some(lefts), false) = (lefts, machine.gpus.is_empty()) {
                candidates.push((
                    lefts.iter().sum(),
                    machine.gpus.iter().map(|g| g.index).collect(),
                ));
            }
        } else {
            candidates.extend(
                machine
                    .gpus
                    .iter()
                    .filter_map(|g| left(g).map(|l| (l, vec![g.index]))),
            );
        }
        for (l, gpus) in candidates {
            let key = (l, machine.name.clone(), gpus[0]);
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, (machine.name.clone(), gpus)));
            }
        }
    }
    best.map(|(_, choice)| choice)
}

fn check_invariants(s: &Scheduler) -> Result<(), TestCaseError> {
    for machine in s.inventory().machines() {
        for g in &machine.gpus {
            let hold = s.hold(&GpuRef::new(&machine.name, g.index)).unwrap();
            prop_assert!(
                hold.taken() <= g.offered(),
                "{} of {} over what it offers",
                machine.name,
                g.index
            );
            if let Hold::Shared(sharers) = hold {
                prop_assert!(
                    !sharers.is_empty(),
                    "a shared GPU with no sharer should be free"
                );
            }
        }
        let (cores, memory) = s.machine_use(&machine.name).unwrap();
        prop_assert!(cores <= machine.cpu_cores && memory <= machine.memory);
    }
    Ok(())
}

/// A committed assignment drawn against whatever fleet it meets: a machine, a subset of its GPUs (perhaps
/// with one it does not have), shared or whole, and cores and memory that may be past the machine's.
#[derive(Debug, Clone)]
struct Commit {
    machine: usize,
    gpus: u8,
    tenths_gb: Option<u64>,
    cores: u32,
    memory_gb: u64,
    unknown_gpu: bool,
}

#[derive(Debug, Clone)]
enum Step {
    Op(Op),
    Commit(Commit),
}

fn step_strategy() -> impl Strategy<Value = Step> {
    let commit = (
        any::<usize>(),
        any::<u8>(),
        proptest::option::of(1u64..=400),
        0u32..=24,
        0u64..=600,
        proptest::bool::weighted(0.05),
    )
        .prop_map(
            |(machine, gpus, tenths_gb, cores, memory_gb, unknown_gpu)| Commit {
                machine,
                gpus,
                tenths_gb,
                cores,
                memory_gb,
                unknown_gpu,
            },
        );
    prop_oneof![
        3 => op_strategy().prop_map(Step::Op),
        2 => commit.prop_map(Step::Commit),
    ]
}

fn to_assignment(s: &Scheduler, c: &Commit) -> Assignment {
    let machines = s.inventory().machines();
    let m = &machines[c.machine % machines.len()];
    let mut gpus: Vec<u32> = m
        .gpus
        .iter()
        .filter(|g| c.gpus & (1 << (g.index % 8)) != 0)
        .map(|g| g.index)
        .collect();
    if c.unknown_gpu {
        gpus.push(99);
    }
    Assignment {
        machine: m.name.clone(),
        gpus,
        shared: c.tenths_gb.map(|t| Bytes(t * GB / 10)),
        cpu_cores: c.cores,
        memory: Bytes::gb(c.memory_gb),
    }
}

/// Whether a committed assignment cannot be held at all: a GPU not in the inventory, one held whole, or a
/// shared one for whole work.
fn cannot_hold(s: &Scheduler, a: &Assignment) -> bool {
    a.gpus
        .iter()
        .any(|&i| match s.hold(&GpuRef::new(&a.machine, i)) {
            None | Some(Hold::Whole(_)) => true,
            Some(Hold::Shared(_)) => a.shared.is_none(),
            Some(Hold::Free) => false,
        })
}

/// The room index holds every shareable GPU of a machine that sees its GPUs apart, by what it offers less what
/// its sharers take (zero when they take more), and each GPU's count of what is taken matches its sharers.
fn check_room_index(s: &Scheduler) -> Result<(), TestCaseError> {
    let mut expected = BTreeSet::new();
    for (id, slot) in s.gpus.iter().enumerate() {
        let machine = &s.inventory().machines()[slot.machine];
        let gpu = &machine.gpus[slot.pos];
        prop_assert_eq!(slot.taken, slot.hold.taken());
        if let Hold::Shared(sharers) = &slot.hold {
            prop_assert!(
                !sharers.is_empty(),
                "a shared GPU with no sharer should be free"
            );
        }
        if !matches!(slot.hold, Hold::Whole(_)) && !machine.all_gpus_visible {
            let offered = gpu.total.get() - gpu.held_outside.get();
            expected.insert((offered.saturating_sub(slot.taken.get()), id));
        }
    }
    prop_assert_eq!(&s.by_room, &expected);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn best_fit_placement_matches_a_brute_force_search_and_never_overfills(machines in fleet_strategy(), ops in proptest::collection::vec(op_strategy(), 1..40)) {
        let mut s = Scheduler::new(Inventory::new(machines).unwrap());
        for (n, op) in ops.iter().enumerate() {
            if let Op::Release(i) = op {
                let names: Vec<String> = s.workers().keys().cloned().collect();
                if !names.is_empty() {
                    s.release(&names[i % names.len()]);
                }
                continue;
            }
            let request = to_request(op).unwrap();
            let expected = matches!(op, Op::Shared { .. }).then(|| oracle_single_shared(&s, &request));
            let decision = s.place(&format!("w{n}"), &request).unwrap();
            match (&decision, expected) {
                (Decision::Place(a), Some(Some((machine, gpus)))) => {
                    prop_assert_eq!((&a.machine, &a.gpus), (&machine, &gpus));
                }
                (Decision::Wait(reasons), Some(None)) => prop_assert!(!reasons.is_empty()),
                (Decision::Wait(reasons), None) => prop_assert!(!reasons.is_empty()),
                (Decision::Place(_), None) => {}
                (d, e) => prop_assert!(false, "decided {:?}, brute force says {:?}", d, e),
            }
            check_invariants(&s)?;
        }
    }

    #[test]
    fn placement_is_deterministic(machines in fleet_strategy(), ops in proptest::collection::vec(op_strategy(), 1..30)) {
        let run = || {
            let mut s = Scheduler::new(Inventory::new(machines.clone()).unwrap());
            ops.iter().enumerate().filter_map(|(n, op)| to_request(op).map(|r| s.place(&format!("w{n}"), &r).unwrap())).collect::<Vec<_>>()
        };
        prop_assert_eq!(run(), run());
    }

    #[test]
    fn releasing_everything_leaves_every_gpu_free(machines in fleet_strategy(), ops in proptest::collection::vec(op_strategy(), 1..30)) {
        let mut s = Scheduler::new(Inventory::new(machines).unwrap());
        for (n, op) in ops.iter().enumerate() {
            if let Some(r) = to_request(op) {
                s.place(&format!("w{n}"), &r).unwrap();
            }
        }
        let names: Vec<String> = s.workers().keys().cloned().collect();
        for name in names {
            s.release(&name).unwrap();
        }
        for m in s.inventory().machines() {
            for g in &m.gpus {
                prop_assert_eq!(s.hold(&GpuRef::new(&m.name, g.index)), Some(&Hold::Free));
            }
            prop_assert_eq!(s.machine_use(&m.name), Some((0, Bytes::ZERO)));
        }
    }

    #[test]
    fn after_committed_holds_best_fit_still_matches_a_brute_force_search_and_never_overfills(machines in fleet_strategy(), steps in proptest::collection::vec(step_strategy(), 1..40)) {
        let mut s = Scheduler::new(Inventory::new(machines).unwrap());
        for (n, step) in steps.iter().enumerate() {
            let name = format!("w{n}");
            match step {
                Step::Commit(c) => {
                    let assignment = to_assignment(&s, c);
                    let refused = cannot_hold(&s, &assignment);
                    let before = s.workers().len();
                    let held = s.hold_committed(&name, assignment.clone());
                    prop_assert_eq!(held.is_err(), refused, "{:?} for {:?}", held, assignment);
                    prop_assert_eq!(s.workers().len(), before + usize::from(!refused));
                }
                Step::Op(Op::Release(i)) => {
                    let names: Vec<String> = s.workers().keys().cloned().collect();
                    if !names.is_empty() {
                        s.release(&names[i % names.len()]);
                    }
                }
                Step::Op(op) => {
                    let request = to_request(op).unwrap();
                    let expected = matches!(op, Op::Shared { .. }).then(|| oracle_single_shared(&s, &request));
                    let holds: BTreeMap<GpuRef, Hold> = s
                        .inventory()
                        .machines()
                        .iter()
                        .flat_map(|m| m.gpus.iter().map(move |g| GpuRef::new(&m.name, g.index)))
                        .map(|gpu| (gpu.clone(), s.hold(&gpu).unwrap().clone()))
                        .collect();
                    let decision = s.place(&name, &request).unwrap();
                    match (&decision, expected) {
                        (Decision::Place(a), Some(Some((machine, gpus)))) => {
                            prop_assert_eq!((&a.machine, &a.gpus), (&machine, &gpus));
                        }
                        (Decision::Wait(reasons), Some(None) | None) => prop_assert!(!reasons.is_empty()),
                        (Decision::Place(_), None) => {}
                        (d, e) => prop_assert!(false, "decided {:?}, brute force says {:?}", d, e),
                    }
                    if let Decision::Place(a) = &decision {
                        for &index in &a.gpus {
                            let gpu = GpuRef::new(&a.machine, index);
                            let before = &holds[&gpu];
                            let offered = s.inventory().gpu(&gpu).unwrap().offered();
                            match a.shared {
                                Some(need) => prop_assert!(
                                    !matches!(before, Hold::Whole(_)) && before.taken() + need <= offered,
                                    "{} placed on {} ({:?}, offers {})", need, gpu, before, offered
                                ),
                                None => prop_assert_eq!(before, &Hold::Free),
                            }
                        }
                    }
                }
            }
            check_room_index(&s)?;
        }
    }
}

#[test]
fn an_mps_gpu_takes_its_48th_engine_and_turns_the_49th_to_a_time_sliced_gpu() {
    let mut s = fleet(vec![machine("node", &[80, 80])]);
    s.set_sharing(&GpuRef::new("node", 0), Sharing::Mps);
    assert_eq!(s.sharing(&GpuRef::new("node", 0)), Sharing::Mps);
    assert_eq!(s.sharing(&GpuRef::new("node", 1)), Sharing::TimeSlicing);
    // Fill GPU 0 first: it is the fuller once it holds something.
    placed(s.place("big", &shared(20.0)));
    for i in 1..MPS_MAX_CLIENTS {
        let a = placed(s.place(&format!("e{i}"), &shared(0.5)));
        assert_eq!(a.gpus, [0], "engine {i}");
    }
    let next = placed(s.place("e48", &shared(0.5)));
    assert_eq!(next.gpus, [1], "the 49th goes where time-slicing takes it");
    let pinned = request(
        r#"{"gpu_requests": {"count": 1, "shared": true, "memory_gb": 1, "ids": ["node:0"]}}"#,
    );
    assert_eq!(
        waits(s.place("pinned", &pinned)),
        ["GPU 0 of node runs MPS, whose server takes at most 48 engines, and has that many"]
    );
}

#[test]
fn an_engine_on_several_gpus_does_not_take_an_mps_gpu() {
    let mut s = fleet(vec![machine("node", &[24, 24])]);
    s.set_sharing(&GpuRef::new("node", 1), Sharing::Mps);
    let two = request(r#"{"gpu_requests": {"count": 2, "shared": true, "memory_gb": 4}}"#);
    let reasons = waits(s.place("tp", &two));
    assert!(
        reasons.contains(
            &"GPU 1 of node runs MPS, where each engine runs on that one GPU; it needs several"
                .to_owned()
        ),
        "{reasons:?}"
    );
    // One GPU is fine, and a committed hold is checked the same way.
    assert_eq!(placed(s.place("one", &shared(4.0))).gpus.len(), 1);
    assert!(matches!(
        s.hold_for(
            "tp",
            Assignment {
                gpus: vec![0, 1],
                ..shared_on("node", 1, 1.0)
            }
        ),
        Err(ScheduleError::DoesNotFit(PendingReason::MpsOneGpu { .. }))
    ));
}
