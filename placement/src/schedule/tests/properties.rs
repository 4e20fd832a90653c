//! Properties over random fleets and histories: best fit against a brute-force oracle, determinism, release,
//! and the room index kept true after committed holds.

use super::*;
use crate::request::{GpuRequests, RequestedResources};
use crate::testing::machine;
use crate::units::GB;
use proptest::prelude::*;

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

/// Fleets with more GPUs than a waiting worker lists reasons for.
fn larger_fleet_strategy() -> impl Strategy<Value = Vec<Machine>> {
    let gpus = proptest::collection::vec((1u64..=16, 0u64..=2), 2..6);
    proptest::collection::vec(gpus, 2..6).prop_map(|machines| {
        machines
            .into_iter()
            .enumerate()
            .map(|(i, gpus)| {
                let sizes: Vec<u64> = gpus.iter().map(|g| g.0 * 4).collect();
                let mut m = machine(&format!("m{i}"), &sizes);
                for (g, (_, held)) in m.gpus.iter_mut().zip(gpus) {
                    g.held_outside = Bytes::gb(held).min(g.total);
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
    let mut over = BTreeSet::new();
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
        if slot.taken > gpu.offered() {
            over.insert(id);
        }
        if !matches!(slot.hold, Hold::Whole(_)) && !machine.all_gpus_visible {
            let offered = gpu.total.get() - gpu.held_outside.get();
            expected.insert((offered.saturating_sub(slot.taken.get()), id));
        }
    }
    prop_assert_eq!(&s.by_room, &expected);
    prop_assert_eq!(
        &s.over,
        &over,
        "the over-committed GPUs are those a walk finds"
    );
    Ok(())
}

/// Every reason the fleet has for `request` to wait, machine by machine in its order: what was listed
/// whole before the list was bounded.
fn every_reason(s: &Scheduler, request: &WorkerRequest) -> Vec<PendingReason> {
    let demand = request.gpus.as_ref().unwrap();
    (0..s.machines.len())
        .filter_map(|m| s.machine_choice(m, request, demand).err())
        .flatten()
        .collect()
}

/// The GPU a reason is about, where it is about one.
fn gpu_of(reason: &PendingReason) -> Option<&GpuRef> {
    use PendingReason::*;
    match reason {
        SharedFull { gpu, .. }
        | OffersTooLittle { gpu, .. }
        | HeldWhole { gpu, .. }
        | Shared { gpu, .. }
        | WrongVendor { gpu, .. }
        | WrongModel { gpu, .. }
        | Unhealthy { gpu }
        | MpsFull { gpu }
        | MpsOneGpu { gpu }
        | CutIntoInstances { gpu }
        | InstanceHeldWhole { gpu }
        | InstanceAlone { gpu } => Some(gpu),
        _ => None,
    }
}

/// A waiting worker's reasons against every reason the fleet has: all of them where they are few enough;
/// otherwise as many as are listed, each one of them, in the fleet's order, then `More`: those of GPUs and
/// machines it may use before those its own rules turn away, and for one shared GPU no GPU of the first
/// kind left out with more room than one listed.
fn check_reasons(
    s: &Scheduler,
    request: &WorkerRequest,
    listed: &[PendingReason],
) -> Result<(), TestCaseError> {
    let all = every_reason(s, request);
    if all.is_empty() {
        prop_assert_eq!(listed, &[PendingReason::NoGpuMatches][..]);
        return Ok(());
    }
    if all.len() <= REASONS_LISTED {
        prop_assert_eq!(listed, &all[..]);
        return Ok(());
    }
    prop_assert_eq!(listed.len(), REASONS_LISTED + 1);
    prop_assert_eq!(listed.last(), Some(&PendingReason::More));
    let shown = &listed[..REASONS_LISTED];
    let positions: Vec<usize> = shown
        .iter()
        .map(|r| {
            all.iter()
                .position(|a| a == r)
                .expect("a listed reason is one of the fleet's")
        })
        .collect();
    prop_assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "not in the fleet's order: {:?}",
        positions
    );
    let near_left_out = all.iter().any(|r| !r.is_barred() && !shown.contains(r));
    prop_assert!(
        !near_left_out || shown.iter().all(|r| !r.is_barred()),
        "a GPU its rules turn away is listed before one it may use"
    );
    let demand = request.gpus.as_ref().unwrap();
    if demand.count == 1 && matches!(demand.mode, GpuMode::Shared(_)) {
        let room = |r: &PendingReason| {
            gpu_of(r)
                .filter(|_| !r.is_barred())
                .and_then(|g| s.flat_id(g))
                .filter(|&id| s.by_room.contains(&(s.room(id), id)))
                .map(|id| s.room(id))
        };
        let least_listed = shown.iter().filter_map(room).min();
        for left_out in all.iter().filter(|r| !shown.contains(r)) {
            if let (Some(left), Some(least)) = (room(left_out), least_listed) {
                prop_assert!(
                    left <= least,
                    "{} left out with more room than a GPU listed",
                    left_out
                );
            }
        }
    }
    Ok(())
}

/// Asks for any of the kinds a worker may wait as: shared, whole GPUs (one or two), or no GPU with much
/// of a machine's memory.
fn ask_strategy() -> impl Strategy<Value = WorkerRequest> {
    prop_oneof![
        op_strategy().prop_filter_map("a request", |op| to_request(&op)),
        (1u64..=600).prop_map(|gb| {
            WorkerRequest::from_wire(&RequestedResources {
                cpu_cores: Some(1.0),
                memory_bytes: Some((gb << 30) as f64),
                gpu_requests: None,
            })
            .unwrap()
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A request that waits, asked again after some places and releases of the machines they touched,
    /// is decided as a whole decision over the fleet decides it.
    #[test]
    fn a_waiting_worker_asked_again_of_the_machines_a_change_touched_is_decided_as_the_whole_fleet_decides(
        machines in prop_oneof![fleet_strategy(), larger_fleet_strategy()],
        before in proptest::collection::vec(op_strategy(), 1..30),
        asks in proptest::collection::vec(ask_strategy(), 1..6),
        after in proptest::collection::vec(op_strategy(), 1..8),
    ) {
        let mut s = Scheduler::new(Inventory::new(machines).unwrap());
        let mut n = 0;
        let mut apply = |s: &mut Scheduler, op: &Op, changed: &mut BTreeSet<String>| {
            n += 1;
            match op {
                Op::Release(i) => {
                    let names: Vec<String> = s.workers().keys().cloned().collect();
                    if !names.is_empty() {
                        let a = s.release(&names[i % names.len()]).unwrap();
                        changed.insert(a.machine);
                    }
                }
                _ => {
                    if let Decision::Place(a) = s.place(&format!("w{n}"), &to_request(op).unwrap()).unwrap() {
                        changed.insert(a.machine);
                    }
                }
            }
        };
        let mut ignored = BTreeSet::new();
        for op in &before {
            apply(&mut s, op, &mut ignored);
        }
        let waiting: Vec<&WorkerRequest> = asks
            .iter()
            .filter(|ask| matches!(s.decide(ask), Decision::Wait(_)))
            .collect();
        let mut changed = BTreeSet::new();
        for op in &after {
            apply(&mut s, op, &mut changed);
        }
        for ask in waiting {
            prop_assert_eq!(s.decide_again(ask, &changed), s.decide(ask));
        }
    }

    #[test]
    fn a_waiting_worker_lists_every_reason_when_few_and_otherwise_those_nearest_to_fitting_then_says_there_are_more(
        machines in prop_oneof![fleet_strategy(), larger_fleet_strategy()],
        ops in proptest::collection::vec(op_strategy(), 1..30),
        asks in proptest::collection::vec(prop_oneof![
            op_strategy(),
            (100u64..=640).prop_map(|tenths_gb| Op::Shared { tenths_gb, cores: 0 }),
        ], 1..6),
    ) {
        let mut s = Scheduler::new(Inventory::new(machines).unwrap());
        for (n, op) in ops.iter().enumerate() {
            match op {
                Op::Release(i) => {
                    let names: Vec<String> = s.workers().keys().cloned().collect();
                    if !names.is_empty() {
                        s.release(&names[i % names.len()]).unwrap();
                    }
                }
                _ => {
                    s.place(&format!("w{n}"), &to_request(op).unwrap()).unwrap();
                }
            }
        }
        for ask in asks.iter().filter_map(to_request) {
            if let Decision::Wait(listed) = s.decide(&ask) {
                check_reasons(&s, &ask, &listed)?;
            }
        }
    }

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
