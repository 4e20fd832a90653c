use super::*;
use crate::request::{GpuRequests, RequestedResources};
use crate::testing::{machine, majin};
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
        if cores + request.cpu_cores > machine.cpu_cores || memory + request.memory > machine.memory
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
}
