//! The sample sharing group the share plan page opens on: three models and the router on one 96 GB GPU.

use placement::{BasisPoints, Bytes, GpuRef, GroupGpu, PlanMember};

/// A sharing group: its name, its members with their committed shares, and the GPUs it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SampleGroup {
    /// The group's name.
    pub name: &'static str,
    /// The GPU's model name, for the page's heading.
    pub gpu_model: &'static str,
    /// Members in display order; the router first.
    pub members: Vec<PlanMember>,
    /// The GPUs the group runs on.
    pub gpus: Vec<GroupGpu>,
}

/// `text-router` on GPU 0 of atlas: the semantic router (locked) and three models, 85 % in all.
pub fn text_router() -> SampleGroup {
    let member = |name: &str, pct: u32| PlanMember::new(name, BasisPoints::percent(pct));
    SampleGroup {
        name: "text-router",
        gpu_model: "NVIDIA RTX PRO 6000",
        members: vec![
            PlanMember {
                locked: true,
                ..member("semantic-router", 10)
            },
            member("glm-5.3", 40),
            member("vision", 25),
            member("speech", 10),
        ],
        gpus: vec![GroupGpu {
            gpu: GpuRef::new("atlas", 0),
            total: Bytes::gb(96),
            held_outside: Bytes::ZERO,
            taken_by_others: Bytes::ZERO,
        }],
    }
}
