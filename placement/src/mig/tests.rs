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
