use super::*;
use crate::inventory::{Inventory, Machine};
use crate::request::{GpuMode, Policy, WorkerRequest};
use crate::schedule::Decision;
use crate::testing::machine;
use proptest::prelude::*;

const BUDGET: u64 = 2_000_000;

/// Every packing of a small instance, the fewest bins, and the fewest restarts among packings of at most
/// `target` bins (each target from the fewest to the bins in use now).
struct Oracle {
    fewest: Option<usize>,
    restarts_within: BTreeMap<usize, usize>,
}

fn oracle(instance: &Instance) -> Oracle {
    let n = instance.items.len();
    let b = instance.bins.len();
    let mut bins = vec![0; n];
    let mut fewest = None;
    let mut restarts_at: BTreeMap<usize, usize> = BTreeMap::new();
    loop {
        if instance.fits(&bins) {
            let used = instance.used(&bins);
            let restarts: usize = instance
                .items
                .iter()
                .zip(&bins)
                .filter(|(item, &x)| item.origin != x)
                .map(|(item, _)| item.restarts)
                .sum();
            fewest = Some(fewest.map_or(used, |f: usize| f.min(used)));
            let at = restarts_at.entry(used).or_insert(usize::MAX);
            *at = (*at).min(restarts);
        }
        let mut k = 0;
        while k < n && bins[k] + 1 == b {
            bins[k] = 0;
            k += 1;
        }
        if k == n {
            break;
        }
        bins[k] += 1;
    }
    let mut restarts_within = BTreeMap::new();
    let mut best = usize::MAX;
    for (&used, &restarts) in &restarts_at {
        best = best.min(restarts);
        restarts_within.insert(used, best);
    }
    Oracle {
        fewest,
        restarts_within,
    }
}

/// Small instances whose work fits where it is now.
fn small_instance() -> impl Strategy<Value = Instance> {
    (1usize..=4, 1usize..=2, 0usize..=6)
        .prop_flat_map(|(bins, machines, items)| {
            (
                prop::collection::vec((0u64..=10, 0..machines, prop::bool::weighted(0.2)), bins),
                prop::collection::vec((0u32..=6, 0u64..=6), machines),
                prop::collection::vec(
                    (
                        1u64..=6,
                        0u32..=2,
                        0u64..=2,
                        0..bins,
                        1usize..=2,
                        prop::collection::vec(prop::bool::weighted(0.8), bins),
                    ),
                    items,
                ),
            )
        })
        .prop_map(|(bins, machines, items)| Instance {
            bins: bins
                .into_iter()
                .map(|(room, machine, fixed)| Bin {
                    room,
                    machine,
                    fixed,
                })
                .collect(),
            machines: machines
                .into_iter()
                .map(|(cpu_cores, memory)| Room { cpu_cores, memory })
                .collect(),
            // Each item of a kind of its own.
            kinds: items.iter().map(|item| item.5.clone()).collect(),
            items: items
                .into_iter()
                .enumerate()
                .map(|(kind, (size, cpu, memory, origin, restarts, _))| Item {
                    size,
                    needs: Room {
                        cpu_cores: cpu,
                        memory,
                    },
                    origin,
                    restarts,
                    kind,
                    home: Some(origin),
                })
                .collect(),
        })
        .prop_filter("work fits where it is", |i| i.fits(&i.used_now_bins()))
}

impl Instance {
    fn used_now_bins(&self) -> Vec<usize> {
        self.items.iter().map(|i| i.origin).collect()
    }
}

proptest! {
    #[test]
    fn a_repack_uses_as_few_gpus_as_any_packing_can_with_the_fewest_restarts(instance in small_instance()) {
        let truth = oracle(&instance);
        let found = pack(&instance, Goal::Most, BUDGET).unwrap();
        prop_assert!(instance.fits(&found.bins));
        prop_assert_eq!(Some(found.used), truth.fewest);
        prop_assert_eq!(found.restarts, truth.restarts_within[&found.used]);
    }

    #[test]
    fn asked_to_free_n_gpus_it_frees_at_least_n_with_the_fewest_restarts_or_says_none_can(
        instance in small_instance(),
        asked in 1usize..=4,
    ) {
        let truth = oracle(&instance);
        let now = instance.used_now();
        match pack(&instance, Goal::Free(asked), BUDGET) {
            Ok(found) => {
                prop_assert!(instance.fits(&found.bins));
                prop_assert!(found.used + asked <= now);
                prop_assert_eq!(found.restarts, truth.restarts_within[&(now - asked)]);
            }
            Err(_) => prop_assert!(truth.fewest.is_none_or(|f| f + asked > now)),
        }
    }

    #[test]
    fn emptying_gpus_one_at_a_time_breaks_no_rule_and_moves_only_what_the_gpus_it_frees_held(
        instance in small_instance(),
        asked in proptest::option::of(1usize..=4),
    ) {
        let found = pack::evacuate(&instance, asked.map_or(Goal::Most, Goal::Free));
        prop_assert!(instance.fits(&found.bins));
        let now = instance.used_now();
        prop_assert!(found.used <= now);
        if let Some(asked) = asked {
            prop_assert!(now - found.used <= asked);
        }
        for (item, &b) in instance.items.iter().zip(&found.bins) {
            if b != item.origin {
                prop_assert!(!instance.bins[item.origin].fixed);
                prop_assert!(found.bins.iter().all(|&x| x != item.origin), "{:?}", found);
            }
        }
    }

    #[test]
    fn first_fit_decreasing_never_breaks_a_rule(instance in small_instance()) {
        if let Some(found) = first_fit_decreasing(&instance) {
            prop_assert!(instance.fits(&found.bins));
        }
    }
}

#[test]
fn triplet_instances_of_sixty_items_are_packed_into_their_optimum() {
    for seed in 1..=10 {
        let instance = triplets(20, seed);
        let found = pack(&instance, Goal::Most, BUDGET).unwrap();
        assert!(instance.fits(&found.bins));
        assert_eq!(found.used, 20, "seed {seed}");
    }
}

#[test]
fn triplets_are_filled_exactly_from_items_between_a_quarter_and_a_half() {
    let instance = triplets(40, 7);
    assert_eq!(instance.items.len(), 120);
    assert!(instance.items.iter().all(|i| (250..500).contains(&i.size)));
    let volume: u64 = instance.items.iter().map(|i| i.size).sum();
    assert_eq!(volume, 40 * 1000);
    assert_eq!(instance.lower_bound(), 40);
    assert!(instance.fits(&instance.used_now_bins()));
}

fn fleet(machines: Vec<Machine>) -> Scheduler {
    Scheduler::new(Inventory::new(machines).unwrap())
}

fn shared(s: &mut Scheduler, worker: &str, gb: f64, on: &str) {
    let mut request = WorkerRequest::shared_gb(gb);
    request.gpus.as_mut().unwrap().ids = vec![on.to_owned()];
    assert!(matches!(
        s.place(worker, &request).unwrap(),
        Decision::Place(_)
    ));
}

fn movable(worker: &str) -> Movable {
    Movable {
        name: worker.to_owned(),
        workers: vec![worker.to_owned()],
        demand: GpuDemand {
            count: 1,
            mode: GpuMode::Shared(Bytes::ZERO),
            vendor: None,
            models: Vec::new(),
            healthy_only: true,
            ids: Vec::new(),
            policy: Policy::Any,
        },
        same_size: false,
    }
}

/// Carries the plan out on a copy of the fleet, step by step, as the server would: each start must fit what
/// its GPU offers and what its machine has left at that moment.
fn carry_out(s: &Scheduler, plan: &RepackPlan, units: &[Movable]) -> Scheduler {
    let mut fleet = s.clone();
    let mut stopped: BTreeMap<String, Assignment> = BTreeMap::new();
    for step in &plan.steps {
        match step {
            RepackStep::Stop { unit, gpu } => {
                for worker in &units.iter().find(|u| &u.name == unit).unwrap().workers {
                    let held = fleet.release(worker).unwrap();
                    assert_eq!(held.gpus, vec![gpu.index]);
                    stopped.insert(worker.clone(), held);
                }
            }
            RepackStep::Start { unit, gpu } => {
                for worker in &units.iter().find(|u| &u.name == unit).unwrap().workers {
                    let held = stopped.remove(worker).unwrap();
                    fleet
                        .hold_for(worker, held.moved_to(gpu))
                        .unwrap_or_else(|e| panic!("{step:?} overfills: {e}"));
                }
            }
        }
        assert!(fleet.overcommitted().is_empty());
    }
    assert!(stopped.is_empty(), "every stopped unit starts again");
    fleet
}

/// Two 24 GB GPUs of a demo-like machine, each a third full, and one more with a small model: a repack puts
/// them together.
fn fragmented() -> (Scheduler, Vec<Movable>) {
    let mut s = fleet(vec![machine("gpu-node-1", &[24, 24, 24])]);
    shared(&mut s, "chat", 10.0, "gpu-node-1:0");
    shared(&mut s, "embed", 6.0, "gpu-node-1:1");
    shared(&mut s, "rerank", 4.0, "gpu-node-1:2");
    shared(&mut s, "speech", 3.0, "gpu-node-1:2");
    let units = ["chat", "embed", "rerank", "speech"].map(movable).to_vec();
    (s, units)
}

#[test]
fn a_repack_carried_out_frees_the_gpus_it_promised_and_no_gpu_is_ever_over_what_it_offers() {
    let (s, units) = fragmented();
    let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
    assert_eq!(plan.freed.len(), 2, "{plan:?}");
    assert_eq!(plan.most, 2);
    let after = carry_out(&s, &plan, &units);
    for gpu in &plan.freed {
        assert_eq!(after.hold(gpu), Some(&Hold::Free));
    }
    // 23 GB on one 24 GB GPU: the two on GPU 2 stay, chat and embed join them.
    assert_eq!(plan.restarts, 2);
    assert!(plan
        .moves
        .iter()
        .all(|m| m.to == GpuRef::new("gpu-node-1", 2)));
}

#[test]
fn asked_for_more_gpus_than_memory_allows_the_repack_says_how_many_it_could_free() {
    let (s, units) = fragmented();
    let err = plan_repack(&s, &units, Goal::Free(3), BUDGET).unwrap_err();
    assert_eq!(
        err.to_string(),
        "No repack frees 3 GPUs: by memory, at most 2 can be freed."
    );
}

#[test]
fn asked_for_one_gpu_the_repack_restarts_the_fewest_workers() {
    let (s, units) = fragmented();
    let plan = plan_repack(&s, &units, Goal::Free(1), BUDGET).unwrap();
    assert_eq!(plan.freed.len(), 1);
    assert_eq!(plan.restarts, 1, "embed moves beside chat: {plan:?}");
    carry_out(&s, &plan, &units);
}

/// A fleet of `machines` × 8 GPUs of 80 GB, `workers` of `gb(w)` GB placed by best fit, then every third
/// gone; the rest movable.
fn fleet_placed(
    machines: usize,
    workers: usize,
    gb: impl Fn(usize) -> f64,
) -> (Scheduler, Vec<Movable>) {
    let mut s = fleet(
        (0..machines)
            .map(|m| machine(&format!("m{m:03}"), &[80; 8]))
            .collect(),
    );
    let names: Vec<String> = (0..workers).map(|w| format!("w{w:05}")).collect();
    for (w, name) in names.iter().enumerate() {
        assert!(matches!(
            s.place(name, &WorkerRequest::shared_gb(gb(w))).unwrap(),
            Decision::Place(_)
        ));
    }
    let mut units = Vec::new();
    for (w, name) in names.iter().enumerate() {
        if w % 3 == 0 {
            s.release(name);
        } else {
            units.push(movable(name));
        }
    }
    (s, units)
}

/// Work of 1–12 GB, 32 to a machine, then every third gone.
fn fleet_with_holes(machines: usize) -> (Scheduler, Vec<Movable>) {
    fleet_placed(machines, machines * 32, |w| 1.0 + (w * 7 % 12) as f64)
}

#[test]
fn asked_to_free_ten_gpus_of_a_large_fleet_the_repack_moves_only_what_those_ten_held() {
    let (s, units) = fleet_with_holes(40);
    let plan = plan_repack(&s, &units, Goal::Free(10), 50_000).unwrap();
    assert!(plan.freed.len() >= 10, "{}", plan.freed.len());
    for m in &plan.moves {
        assert!(
            plan.freed.contains(&m.from),
            "{} moves from {}, which stays in use",
            m.unit,
            m.from
        );
    }
    assert!(plan.restarts < 100, "{} restarts", plan.restarts);
}

#[test]
fn work_pinned_to_its_gpu_by_id_stays_there() {
    let (s, mut units) = fragmented();
    units[0].demand.ids = vec!["gpu-node-1:0".into()];
    units[1].demand.ids = vec!["gpu-node-1:1".into()];
    let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
    assert_eq!(plan.freed, vec![GpuRef::new("gpu-node-1", 2)]);
    assert!(plan
        .moves
        .iter()
        .all(|m| m.unit == "rerank" || m.unit == "speech"));
}

#[test]
fn work_the_operator_did_not_offer_stays_and_its_gpu_takes_no_more_than_it_has_left() {
    let (s, units) = fragmented();
    // chat is not offered: its GPU keeps it and has 14 GB for the rest.
    let plan = plan_repack(&s, &units[1..], Goal::Most, BUDGET).unwrap();
    assert_eq!(plan.freed.len(), 2);
    assert!(plan.moves.iter().all(|m| m.unit != "chat"));
    carry_out(&s, &plan, &units[1..]);
}

#[test]
fn a_machine_short_of_cpu_cores_takes_no_work_that_needs_them() {
    let mut a = machine("a", &[24]);
    a.cpu_cores = 4;
    let mut s = fleet(vec![a, machine("b", &[24])]);
    let mut request = WorkerRequest::shared_gb(4.0);
    request.cpu_cores = 4;
    request.gpus.as_mut().unwrap().ids = vec!["a:0".into()];
    s.place("holds-a", &request).unwrap();
    request.gpus.as_mut().unwrap().ids = vec!["b:0".into()];
    s.place("on-b", &request).unwrap();
    let units = vec![movable("on-b")];
    let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
    assert!(plan.moves.is_empty(), "a has no cores left for on-b");
}

#[test]
fn work_that_holds_a_gpu_whole_or_spans_gpus_is_not_moved_and_the_reason_is_said() {
    let mut s = fleet(vec![machine("a", &[24, 24])]);
    let mut whole = WorkerRequest::shared_gb(1.0);
    whole.gpus.as_mut().unwrap().mode = GpuMode::Whole;
    s.place("trainer", &whole).unwrap();
    let err = plan_repack(&s, &[movable("trainer")], Goal::Most, BUDGET).unwrap_err();
    assert_eq!(
        err.to_string(),
        "trainer of trainer does not share one GPU, so it stays where it is; only shared work on one GPU moves"
    );
    let err = plan_repack(&s, &[movable("nobody")], Goal::Most, BUDGET).unwrap_err();
    assert_eq!(err.to_string(), "nobody names nobody, which is not placed");
}

#[test]
fn a_group_moves_whole_and_only_to_a_gpu_of_its_size() {
    let mut s = fleet(vec![machine("a", &[24, 24, 48])]);
    shared(&mut s, "g-1", 4.0, "a:0");
    shared(&mut s, "g-2", 4.0, "a:0");
    shared(&mut s, "solo", 8.0, "a:1");
    let mut group = movable("text");
    group.workers = vec!["g-1".into(), "g-2".into()];
    group.same_size = true;
    let units = vec![group, movable("solo")];
    let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
    assert_eq!(plan.freed.len(), 1);
    for m in &plan.moves {
        if m.unit == "text" {
            assert_eq!(m.workers, vec!["g-1", "g-2"]);
            assert_ne!(m.to, GpuRef::new("a", 2), "the 48 GB GPU is another size");
        }
    }
    carry_out(&s, &plan, &units);
}

#[test]
fn units_that_must_trade_places_stop_one_first_and_never_overfill() {
    // z (2 GB) fits beside fixed work only once x (6) and y (5) trade GPUs, and neither can go first.
    let mut s = fleet(vec![machine("m", &[10, 10, 10])]);
    shared(&mut s, "fixed-a", 3.0, "m:0");
    shared(&mut s, "x", 6.0, "m:0");
    shared(&mut s, "fixed-b", 4.0, "m:1");
    shared(&mut s, "y", 5.0, "m:1");
    shared(&mut s, "z", 2.0, "m:2");
    let units = ["x", "y", "z"].map(movable).to_vec();
    let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
    assert_eq!(plan.freed, vec![GpuRef::new("m", 2)], "{plan:?}");
    let parked = plan.steps.windows(2).any(|w| match (&w[0], &w[1]) {
        (RepackStep::Stop { unit, .. }, RepackStep::Start { unit: next, .. }) => unit != next,
        (RepackStep::Stop { .. }, RepackStep::Stop { .. }) => true,
        _ => false,
    });
    assert!(
        parked,
        "one unit stops before another starts: {:?}",
        plan.steps
    );
    carry_out(&s, &plan, &units);
}

fn small_fleet() -> impl Strategy<Value = (Vec<u64>, Vec<(u64, usize, bool)>)> {
    (
        prop::collection::vec(prop::sample::select(vec![8u64, 16, 24]), 2..=5),
        prop::collection::vec((1u64..=8, 0usize..5, prop::bool::weighted(0.8)), 1..=8),
    )
}

proptest! {
    #[test]
    fn every_step_of_a_repack_fits_and_it_frees_what_it_says((gpus, work) in small_fleet()) {
        let mut s = fleet(vec![machine("m", &gpus)]);
        let mut units = Vec::new();
        for (n, (gb, at, moves)) in work.into_iter().enumerate() {
            let name = format!("w{n}");
            let mut request = WorkerRequest::shared_gb(gb as f64);
            request.gpus.as_mut().unwrap().ids = vec![format!("m:{}", at % gpus.len())];
            if matches!(s.place(&name, &request).unwrap(), Decision::Place(_)) && moves {
                units.push(movable(&name));
            }
        }
        let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
        let after = carry_out(&s, &plan, &units);
        for gpu in &plan.freed {
            prop_assert_eq!(after.hold(gpu), Some(&Hold::Free));
        }
        let busy = |loads: &[GpuLoad]| loads.iter().filter(|l| !l.sharers.is_empty()).count();
        prop_assert_eq!(busy(&plan.before) + plan.filled.len(), busy(&plan.after) + plan.freed.len());
        prop_assert!(plan.freed.len() - plan.filled.len() <= plan.most);
    }
}

#[test]
fn work_moves_onto_an_mps_gpu_only_where_its_48_engines_hold_whatever_else_moves_there() {
    let mps_fleet = |already: usize| {
        let mut s = fleet(vec![machine("n", &[24, 24])]);
        s.set_sharing(&GpuRef::new("n", 0), Sharing::Mps);
        for i in 0..already {
            shared(&mut s, &format!("fixed-{i}"), 0.1, "n:0");
        }
        shared(&mut s, "a", 1.0, "n:1");
        shared(&mut s, "b", 1.0, "n:1");
        s
    };
    let units = ["a", "b"].map(movable).to_vec();
    // 46 stay and 2 come: 48, as many as MPS takes.
    let s = mps_fleet(46);
    let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
    assert_eq!(plan.freed, vec![GpuRef::new("n", 1)]);
    carry_out(&s, &plan, &units);
    // 47 stay: a second newcomer would be the 49th, so none comes and nothing is freed.
    let s = mps_fleet(47);
    let plan = plan_repack(&s, &units, Goal::Most, BUDGET).unwrap();
    assert!(plan.moves.is_empty(), "{plan:?}");
    assert!(plan.freed.is_empty());
}

#[test]
fn a_repack_step_speaks_snake_case_beside_the_deprecated_key() {
    let gpu = GpuRef::new("atlas", 1);
    let steps = vec![
        RepackStep::Stop {
            unit: "scribe".into(),
            gpu: gpu.clone(),
        },
        RepackStep::Start {
            unit: "scribe".into(),
            gpu: gpu.clone(),
        },
    ];
    let json = serde_json::to_value(&steps).unwrap();
    let at = serde_json::to_value(&gpu).unwrap();
    assert_eq!(
        json,
        serde_json::json!([
            {"action": "stop", "unit": "scribe", "gpu": at, "Stop": {"unit": "scribe", "gpu": at}},
            {"action": "start", "unit": "scribe", "gpu": at, "Start": {"unit": "scribe", "gpu": at}},
        ])
    );
    assert_eq!(
        serde_json::from_value::<Vec<RepackStep>>(json).unwrap(),
        steps
    );
}

#[test]
fn right_sized_shares_let_a_repack_free_a_gpu_the_shares_as_they_are_do_not() {
    let on = |gpu: u32, gb: u64| Assignment {
        machine: "gpu-node-1".into(),
        gpus: vec![gpu],
        shared: Some(Bytes::gb(gb)),
        cpu_cores: 0,
        memory: Bytes::ZERO,
    };
    let input = RepackInput {
        inventory: Inventory::new(vec![machine("gpu-node-1", &[24, 24])]).unwrap(),
        holds: vec![("chat".into(), on(0, 14)), ("embed".into(), on(1, 14))],
        movable: ["chat", "embed"].map(movable).to_vec(),
        sharing: Vec::new(),
    };
    assert!(input.plan(Goal::Most).unwrap().freed.is_empty());
    // chat right-sized to 25 % of its 24 GB GPU: 6 GB beside embed's 14.
    let right_sized = input.with_shares(&[("chat".into(), BasisPoints::percent(25))]);
    assert_eq!(right_sized.holds[0].1.shared, Some(Bytes::gb(6)));
    assert_eq!(right_sized.holds[1].1.shared, Some(Bytes::gb(14)));
    assert_eq!(right_sized.plan(Goal::Most).unwrap().freed.len(), 1);
}

/// `machines` × 8 GPUs of 80 GB, four workers of 4, 13 and 22 GB placed by best fit to each GPU (two of
/// each in turn, 78 GB), then every 4 GB one gone: each GPU in use keeps 10 GB, too little for any worker
/// left, so no worker moves to a GPU in use unless others make room for it.
fn fleet_without_slack(machines: usize) -> (Scheduler, Vec<Movable>) {
    fleet_placed(machines, machines * 4, |w| [4.0, 13.0, 22.0][w % 3])
}

#[test]
fn asked_to_free_3_or_5_gpus_where_no_gpu_has_room_for_any_worker_the_repack_frees_that_many_not_every_gpu_it_can(
) {
    let (s, units) = fleet_without_slack(200);
    let mut restarts = Vec::new();
    for asked in [1, 3, 5] {
        let plan = plan_repack(&s, &units, Goal::Free(asked), super::BUDGET).unwrap();
        assert_eq!(plan.freed.len(), asked, "asked for {asked}");
        carry_out(&s, &plan, &units);
        restarts.push(plan.restarts);
    }
    let most = plan_repack(&s, &units, Goal::Most, super::BUDGET).unwrap();
    assert!(most.freed.len() > 5, "{}", most.freed.len());
    // Each GPU freed moves what it held and what made room for it: tens of workers, not the hundreds a
    // packing from scratch restarts.
    assert!(
        restarts[0] < restarts[1] && restarts[1] < restarts[2],
        "{restarts:?}"
    );
    assert!(restarts[2] < 20 * 5, "{restarts:?}");
    assert!(
        restarts[2] * 3 < most.restarts,
        "{restarts:?} against {}",
        most.restarts
    );
}

/// Fleets too large for the oracle: GPUs of 80 or 141 GB on a few machines, filled by best fit with work of
/// a few sizes, then some of it gone.
fn mid_instance() -> impl Strategy<Value = Instance> {
    (
        6usize..=40,
        1usize..=4,
        prop::collection::vec(prop::sample::select(vec![4u64, 9, 13, 22, 30]), 1..=3),
        prop::collection::vec((0usize..64, prop::bool::weighted(0.35)), 10..=160),
        prop::bool::weighted(0.5),
    )
        .prop_map(|(bins, machines, sizes, work, large)| {
            let room = if large { 141 } else { 80 };
            let mut left: Vec<u64> = vec![room; bins];
            let mut items = Vec::new();
            for (pick, gone) in work {
                let size = sizes[pick % sizes.len()];
                let best = (0..bins)
                    .filter(|&b| left[b] >= size)
                    .min_by_key(|&b| (left[b], b));
                let Some(b) = best else { continue };
                left[b] -= size;
                if !gone {
                    items.push(Item {
                        size,
                        needs: Room {
                            cpu_cores: 0,
                            memory: 0,
                        },
                        origin: b,
                        restarts: 1,
                        kind: 0,
                        home: Some(b),
                    });
                }
            }
            Instance {
                bins: (0..bins)
                    .map(|b| Bin {
                        room,
                        machine: b % machines,
                        fixed: false,
                    })
                    .collect(),
                machines: vec![
                    Room {
                        cpu_cores: 0,
                        memory: 0
                    };
                    machines
                ],
                items,
                kinds: vec![vec![true; bins]],
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn asked_to_free_n_gpus_a_repack_frees_n_whenever_emptying_gpus_one_at_a_time_can_and_restarts_no_more(
        instance in mid_instance(),
        asked in 1usize..=5,
    ) {
        let now = instance.used_now();
        let evacuated = pack::evacuate(&instance, Goal::Free(asked));
        let meets = |used: usize| used + asked <= now;
        match pack(&instance, Goal::Free(asked), 40_000) {
            Ok(found) => {
                prop_assert!(instance.fits(&found.bins));
                prop_assert!(meets(found.used));
                if meets(evacuated.used) {
                    prop_assert!(found.restarts <= evacuated.restarts);
                }
                if let Ok(more) = pack(&instance, Goal::Free(asked + 1), 40_000) {
                    prop_assert!(found.restarts <= more.restarts, "{} for {asked}, {} for one more", found.restarts, more.restarts);
                }
            }
            Err(_) => prop_assert!(!meets(evacuated.used)),
        }
    }
}
