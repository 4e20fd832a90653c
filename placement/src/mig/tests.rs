use super::*;
use crate::inventory::{Gpu, Inventory, Machine};
use crate::request::WorkerRequest;
use crate::schedule::{Decision, Scheduler};
use crate::units::GB;
use proptest::prelude::*;

fn gb(x: u64) -> Bytes {
    Bytes::gb(x)
}

fn tenants(list: &[(&str, u64)]) -> Vec<Tenant> {
    list.iter().map(|&(n, g)| Tenant::new(n, gb(g))).collect()
}

#[test]
fn every_menu_places_each_profile_within_the_eight_memory_slices() {
    for menu in [&A100_40GB, &A100_80GB, &H100_80GB, &H200_141GB] {
        for p in menu.profiles {
            assert!(!p.starts.is_empty(), "{} {}", menu.gpu, p.name);
            for &s in p.starts {
                assert!(
                    s + p.slices <= MEMORY_SLICES,
                    "{} {} at {s}",
                    menu.gpu,
                    p.name
                );
            }
            assert!(p.compute <= COMPUTE_SLICES);
            assert!(p.name.starts_with(&format!("{}g.", p.compute)));
        }
    }
}

#[test]
fn nvml_model_names_find_their_menus() {
    assert_eq!(menu("NVIDIA A100-SXM4-40GB").unwrap().gpu, "A100 40GB");
    assert_eq!(menu("NVIDIA A100 80GB PCIe").unwrap().gpu, "A100 80GB");
    assert_eq!(menu("NVIDIA H100 80GB HBM3").unwrap().gpu, "H100 80GB");
    assert_eq!(menu("NVIDIA H200").unwrap().gpu, "H200 141GB");
    assert!(menu("NVIDIA GeForce RTX 4060").is_none());
}

/// Seed 004, "Try it" 2: a job that fits under MPS but not under MIG.
#[test]
fn a_model_that_fits_beside_two_others_under_mps_needs_the_whole_gpu_under_mig() {
    let h100 = Machine {
        name: "h100-node".into(),
        cpu_cores: 64,
        memory: gb(512),
        all_gpus_visible: false,
        gpus: vec![Gpu {
            index: 0,
            uuid: "GPU-h100".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            vendor: "nvidia".into(),
            total: gb(80),
            held_outside: Bytes::ZERO,
            healthy: true,
            mig: None,
        }],
    };
    let mut mps = Scheduler::new(Inventory::new(vec![h100]).unwrap());
    for (name, need) in [("embedder", 8.0), ("reranker", 6.0), ("small-llm", 45.0)] {
        let placed = mps.place(name, &WorkerRequest::shared_gb(need)).unwrap();
        assert!(
            matches!(placed, Decision::Place(_)),
            "{name} shares the GPU by memory"
        );
    }
    let err = plan(
        menu("NVIDIA H100 80GB HBM3").unwrap(),
        &tenants(&[("embedder", 8), ("reranker", 6), ("small-llm", 45)]),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "small-llm needs 45 GB: only 7g.80gb holds that much, and it takes the whole GPU, leaving no slice for embedder and reranker."
    );
}

#[test]
fn the_same_three_models_fit_an_h200_in_three_instances() {
    let layout = plan(
        &H200_141GB,
        &tenants(&[("embedder", 8), ("reranker", 6), ("small-llm", 45)]),
    )
    .unwrap();
    let shown: Vec<String> = layout.instances.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "small-llm on 3g.71gb (slices 0–3, 69.8 GB)",
            "embedder on 1g.18gb (slices 4–4, 16 GB)",
            "reranker on 1g.18gb (slices 5–5, 16 GB)",
        ]
    );
    assert_eq!((layout.free_slices(), layout.free_compute()), (2, 2));
    assert_eq!(
        layout.commands(3),
        [
            "nvidia-smi mig -i 3 -cgi 9:0 -C",
            "nvidia-smi mig -i 3 -cgi 19:4 -C",
            "nvidia-smi mig -i 3 -cgi 19:5 -C",
        ]
    );
}

#[test]
fn a_model_larger_than_the_largest_instance_is_refused_with_the_largest_named() {
    let err = plan(&A100_40GB, &tenants(&[("llama-70b", 60)])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "llama-70b needs 60 GB; the largest instance of an A100 40GB, 7g.40gb, holds 39.3 GB."
    );
}

#[test]
fn eight_models_are_more_than_seven_instances() {
    let eight: Vec<Tenant> = (0..8)
        .map(|i| Tenant::new(format!("m{i}"), gb(1)))
        .collect();
    assert_eq!(
        plan(&H100_80GB, &eight).unwrap_err().to_string(),
        "An H100 80GB holds at most 7 MIG instances; 8 models were asked for."
    );
    let seven = &eight[..7];
    let layout = plan(&H100_80GB, seven).unwrap();
    let starts: Vec<u8> = layout.instances.iter().map(|p| p.start).collect();
    assert_eq!(starts, [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(layout.free_compute(), 0);
}

#[test]
fn models_whose_smallest_instances_take_more_than_eight_slices_are_refused_with_the_sum() {
    let err = plan(
        &H100_80GB,
        &tenants(&[("chat", 35), ("embed", 15), ("rerank", 15), ("asr", 15)]),
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "The smallest instances that hold these models take 10 of the GPU's 8 memory slices: chat 3g.40gb (4), embed 1g.20gb (2), rerank 1g.20gb (2), asr 1g.20gb (2)."
    );
}

/// Every layout of up to seven tenants, by brute force: each tenant on any profile that holds it, at any
/// start. The planner finds one exactly when one exists, and it takes no more slices than the best.
fn brute(menu: &Menu, needs: &[Bytes]) -> Option<(u8, u8)> {
    fn go(
        menu: &Menu,
        needs: &[Bytes],
        used: u8,
        compute: u8,
        slices: u8,
        best: &mut Option<(u8, u8)>,
    ) {
        let Some((need, rest)) = needs.split_first() else {
            let score = (slices, compute);
            if best.is_none_or(|b| score < b) {
                *best = Some(score);
            }
            return;
        };
        for p in menu.profiles.iter().filter(|p| p.memory() >= *need) {
            for &s in p.starts {
                let mask = ((1u16 << p.slices) - 1) << s;
                if mask > 0xFF
                    || u16::from(used) & mask != 0
                    || compute + p.compute > COMPUTE_SLICES
                {
                    continue;
                }
                go(
                    menu,
                    rest,
                    used | mask as u8,
                    compute + p.compute,
                    slices + p.slices,
                    best,
                );
            }
        }
    }
    let mut best = None;
    go(menu, needs, 0, 0, 0, &mut best);
    best
}

proptest! {
    #[test]
    fn the_planner_finds_a_layout_exactly_when_one_exists_and_takes_the_fewest_slices(
        menu in prop::sample::select(vec![&A100_40GB, &A100_80GB, &H100_80GB, &H200_141GB]),
        needs in prop::collection::vec(1u64..=90, 1..=7),
    ) {
        let needs: Vec<Bytes> = needs.into_iter().map(|g| Bytes(g * GB)).collect();
        let asked: Vec<Tenant> = needs.iter().enumerate().map(|(i, &n)| Tenant::new(format!("m{i}"), n)).collect();
        match (plan(menu, &asked), brute(menu, &needs)) {
            (Ok(layout), Some(best)) => {
                let slices = MEMORY_SLICES - layout.free_slices();
                let compute = COMPUTE_SLICES - layout.free_compute();
                prop_assert_eq!((slices, compute), best);
                for (t, placed) in asked.iter().zip(&asked) {
                    let p = layout.instances.iter().find(|p| p.tenant == t.name).unwrap();
                    prop_assert!(p.profile.memory() >= placed.memory);
                }
            }
            (Err(NoLayout::MemorySlices { needed, .. }), None) => prop_assert!(needed > MEMORY_SLICES),
            (Err(NoLayout::TooBig { .. } | NoLayout::WholeGpu { .. }), None) => {}
            (got, want) => prop_assert!(false, "planner {got:?}, brute force {want:?}"),
        }
    }
}

fn profiles(names: &[&str]) -> Vec<String> {
    names.iter().map(|&n| n.to_owned()).collect()
}

#[test]
fn named_instances_take_placements_that_put_them_side_by_side_and_make_the_commands() {
    let layout = layout_of(&H100_80GB, &profiles(&["1g.10gb", "3g.40gb", "2g.20gb"])).unwrap();
    let shown: Vec<String> = layout.instances.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown,
        [
            "3g.40gb (slices 0–3, 39.5 GB)",
            "2g.20gb (slices 4–5, 19.6 GB)",
            "1g.10gb (slices 6–6, 9.8 GB)",
        ]
    );
    assert_eq!(
        layout.commands(0),
        [
            "nvidia-smi mig -i 0 -cgi 9:0 -C",
            "nvidia-smi mig -i 0 -cgi 14:4 -C",
            "nvidia-smi mig -i 0 -cgi 19:6 -C",
        ]
    );
}

#[test]
fn a_profile_off_the_gpu_s_menu_is_refused_with_the_menu() {
    assert_eq!(
        layout_of(&H200_141GB, &profiles(&["3g.40gb"]))
            .unwrap_err()
            .to_string(),
        "An H200 141GB has no MIG profile \"3g.40gb\"; its menu is 1g.18gb, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb."
    );
    assert_eq!(
        layout_of(&H200_141GB, &[]).unwrap_err().to_string(),
        "Name at least one instance, such as 3g.40gb."
    );
}

#[test]
fn instances_past_the_gpu_s_slices_are_refused_with_each_one_s_slices() {
    assert_eq!(
        layout_of(&H100_80GB, &profiles(&["3g.40gb", "3g.40gb", "1g.10gb"]))
            .unwrap_err()
            .to_string(),
        "An H100 80GB has 7 compute and 8 memory slices (and at most 7 instances); these take 7 and 9: 3g.40gb (3+4), 3g.40gb (3+4), 1g.10gb (1+1), each as compute+memory."
    );
    assert!(matches!(
        layout_of(&H100_80GB, &profiles(&["4g.40gb", "4g.40gb"])),
        Err(NoLayout::OverSlices { compute: 8, .. })
    ));
}

/// Every placement of exactly these profiles, by brute force: whether any puts them side by side.
fn placeable(profiles: &[&Profile]) -> bool {
    fn go(profiles: &[&Profile], used: u8, compute: u8) -> bool {
        let Some((p, rest)) = profiles.split_first() else {
            return true;
        };
        compute + p.compute <= COMPUTE_SLICES
            && p.starts.iter().any(|&s| {
                let span = ((1u16 << p.slices) - 1) as u8;
                let mask = span << s;
                used & mask == 0 && go(rest, used | mask, compute + p.compute)
            })
    }
    go(profiles, 0, 0)
}

proptest! {
    #[test]
    fn named_instances_are_laid_out_exactly_when_some_placement_holds_them(
        menu in prop::sample::select(vec![&A100_40GB, &A100_80GB, &H100_80GB, &H200_141GB]),
        picks in prop::collection::vec(0usize..6, 1..=8),
    ) {
        let chosen: Vec<&Profile> = picks.iter().map(|&i| &menu.profiles[i % menu.profiles.len()]).collect();
        let names: Vec<String> = chosen.iter().map(|p| p.name.to_owned()).collect();
        match layout_of(menu, &names) {
            Ok(layout) => {
                prop_assert!(placeable(&chosen));
                let mut got: Vec<&str> = layout.instances.iter().map(|p| p.profile.name).collect();
                let mut want: Vec<&str> = chosen.iter().map(|p| p.name).collect();
                got.sort_unstable();
                want.sort_unstable();
                prop_assert_eq!(got, want);
                let mut used = 0u8;
                for p in &layout.instances {
                    prop_assert!(p.profile.starts.contains(&p.start));
                    let mask = (((1u16 << p.profile.slices) - 1) as u8) << p.start;
                    prop_assert_eq!(used & mask, 0);
                    used |= mask;
                }
            }
            Err(NoLayout::OverSlices { .. } | NoLayout::NoPlacement { .. }) => prop_assert!(!placeable(&chosen)),
            Err(other) => prop_assert!(false, "{other}"),
        }
    }
}

#[test]
fn an_instance_s_index_names_its_gpu_and_never_meets_a_gpu_s_index() {
    assert_eq!(instance_index(0, 2), 1002);
    assert_eq!(instance_of(1002), Some((0, 2)));
    assert_eq!(instance_of(instance_index(63, 6)), Some((63, 6)));
    assert_eq!(instance_of(63), None);
    assert_eq!(
        crate::GpuRef::new("h200-node", instance_index(1, 0)).to_string(),
        "MIG instance 0 of GPU 1 of h200-node"
    );
    assert_eq!(
        profile_in_name("NVIDIA H100 80GB HBM3 MIG 3g.40gb"),
        Some("3g.40gb")
    );
    assert_eq!(profile_in_name("NVIDIA H100 80GB HBM3"), None);
}

#[test]
fn a_gpu_cut_into_instances_takes_no_work_and_an_instance_takes_one_whole_engine_only() {
    let cut = Gpu {
        mig: Some(crate::MigRole::Cut),
        held_outside: gb(80),
        ..crate::testing::gpu(0, 80)
    };
    let instance = |n: u32| Gpu {
        index: instance_index(0, n),
        mig: Some(crate::MigRole::Instance {
            parent: 0,
            profile: "3g.40gb".into(),
        }),
        ..crate::testing::gpu(0, 39)
    };
    let node = Machine {
        gpus: vec![cut, instance(0), instance(1)],
        ..crate::testing::machine("h100-node", &[])
    };
    let mut s = Scheduler::new(Inventory::new(vec![node]).unwrap());
    let Decision::Wait(reasons) = s.decide(&WorkerRequest::shared_gb(5.0)) else {
        panic!("a share has nowhere to go");
    };
    let reasons: Vec<String> = reasons.iter().map(ToString::to_string).collect();
    assert_eq!(
        reasons,
        [
            "GPU 0 of h100-node is cut into MIG instances: work runs in those",
            "MIG instance 0 of GPU 0 of h100-node takes one engine whole; it asks for a share",
            "MIG instance 1 of GPU 0 of h100-node takes one engine whole; it asks for a share",
        ]
    );
    let mut whole = WorkerRequest::shared_gb(1.0);
    whole.gpus.as_mut().unwrap().mode = crate::request::GpuMode::Whole;
    for (name, on) in [("chat", 1000), ("embed", 1001)] {
        match s.place(name, &whole).unwrap() {
            Decision::Place(a) => assert_eq!(a.gpus, [on], "{name}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(matches!(s.decide(&whole), Decision::Wait(_)));
    // An engine on two GPUs gets none of them.
    let mut s = Scheduler::new(s.inventory().clone());
    let mut two = whole.clone();
    two.gpus.as_mut().unwrap().count = 2;
    let Decision::Wait(reasons) = s.place("tp", &two).unwrap() else {
        panic!("two instances are not two GPUs");
    };
    assert!(reasons
        .iter()
        .any(|r| r.to_string() == "MIG instance 0 of GPU 0 of h100-node runs its engine on it alone; it asks for several GPUs"), "{reasons:?}");
}
