//! Tessera's rules for sharing GPUs between models, with no I/O: the browser runs them (wasm) to judge a
//! plan on every keystroke, and the server runs the same functions again before it commits anything.
//!
//! - [`units`]: bytes and basis points, read once at the edge, shown as the seeds write them.
//! - [`inventory`]: machines and GPUs; a GPU offers its total less what is held outside Tessera.
//! - [`request`] and [`schedule`]: placing workers whole or shared by memory, by best fit.
//! - [`plan`], [`group`] and [`restart`]: share plans of sharing groups, and how a change is rolled out.
//! - [`demand`]: pinned and on-demand members, which make way and when they unload.
//! - [`interference`]: a model slowed by its neighbours, against its latency alone.
//! - [`usage`]: GPU time, use and energy split among sharers.
//! - [`repack`]: moves of shared work that free whole GPUs, with the fewest restarts.
//! - [`sharing`]: how a GPU is shared (time-slicing, MPS, MIG), and what an engine gets under MPS.
//! - [`mig`]: a GPU cut into MIG instances from its menu, and the layout that fits the models meant for it.
//! - [`names`]: names people type (environment variables), checked alike in the browser and the server.
//! - [`estimate`]: a model's memory from its GGUF header: weights, KV cache, compute buffers, each shown.
//! - [`rightsize`]: a model's measured peak against its share, and the smaller share that would hold it.
//! - [`scale`]: replicas that follow a model's load, added after a short window, removed after a long one.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod demand;
pub mod estimate;
pub mod group;
pub mod holder;
pub mod interference;
pub mod inventory;
pub mod mig;
pub mod names;
pub mod plan;
pub mod reason;
pub mod repack;
pub mod request;
pub mod restart;
pub mod rightsize;
pub mod scale;
pub mod schedule;
pub mod sharing;
pub mod units;
pub mod usage;

#[cfg(test)]
mod testing;

pub use demand::{
    eviction_order, make_host_room, tier, Demand, KeepAlive, KeepAliveError, Loaded, Sleeper, Tier,
};
pub use group::{
    check_new_group, choose_group, group_gpus, member_assignments, pick_new_group_gpus, Candidate,
    GroupChoice, GroupError,
};
pub use inventory::{
    offered, parse_gpu_list, Gpu, GpuChoice, GpuRef, GpuRefError, Inventory, InventoryError,
    Machine, MigRole,
};
pub use plan::{judge, running, GroupGpu, PlanMember, Problem, ReplicasWait, Verdict};
pub use reason::PendingReason;
pub use repack::{
    plan_repack, GpuLoad, Movable, Move, RepackError, RepackInput, RepackPlan, RepackStep,
};
pub use request::{
    GpuDemand, GpuMode, GpuRequests, Policy, RequestError, RequestedResources, WorkerRequest,
};
pub use restart::{transition, Change, Restart, Share, Step, Transition};
pub use schedule::{Assignment, Decision, Hold, Overcommit, ScheduleError, Scheduler};
pub use units::{BasisPoints, Bytes, UnitError};
pub use usage::{Figures, GpuMillis, Grouping, Holder, Holding, Sample, UsageReport, UsageRow};
