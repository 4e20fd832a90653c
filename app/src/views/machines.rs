//! Machines and their GPUs: the Nodes tab's rows and the machine page, with each GPU's readings, sharers,
//! MIG part and sharing setting.

use super::models::EngineState;
use super::page::Page;
use placement::{BasisPoints, Bytes};
use serde::{Deserialize, Serialize};

/// A model on a node, as the Nodes tab lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeModel {
    /// The model.
    pub name: String,
    /// Its share of one GPU; `None` on whole GPUs.
    pub share: Option<BasisPoints>,
}

/// A row of the Nodes tab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRow {
    /// The machine.
    pub name: String,
    /// The sharing groups running on it.
    pub groups: Vec<String>,
    /// Its models, in group order.
    pub models: Vec<NodeModel>,
    /// Its GPUs.
    pub gpus: u32,
    /// Its GPUs that shared work may use: healthy and not held whole.
    pub shareable: u32,
    /// All its GPUs' memory.
    pub total: Bytes,
    /// What its shareable GPUs offer beyond what their sharers take.
    pub free: Bytes,
    /// Each GPU at a glance, for the row's picture.
    #[serde(default)]
    pub cells: Vec<GpuCell>,
    /// Its GPUs' model (`NVIDIA H100 80GB HBM3`), or `mixed`.
    #[serde(default)]
    pub gpu_model: String,
}

/// One GPU in a row of the Nodes tab: what Tessera's work takes, what is held outside, what is left;
/// whole or shared; healthy or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuCell {
    /// All its memory.
    pub total: Bytes,
    /// What Tessera's work takes of it (all of what it offers, when held whole).
    pub taken: Bytes,
    /// What something outside Tessera holds.
    pub outside: Bytes,
    /// Held whole by one worker or model.
    pub whole: bool,
    /// Healthy.
    pub healthy: bool,
}

/// How the Nodes tab is sorted: by name (the default), most free memory first, GPU model, the least
/// healthy first, or the most models first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NodeSort {
    /// By name.
    #[default]
    Name,
    /// Most free GPU memory first.
    Free,
    /// By GPU model.
    GpuModel,
    /// Unhealthy GPUs first, the most first.
    Health,
    /// The most models first.
    Models,
}

impl NodeSort {
    /// Every order, as the address spells it (`?sort=free`).
    pub const ALL: [(NodeSort, &'static str); 5] = [
        (NodeSort::Name, "name"),
        (NodeSort::Free, "free"),
        (NodeSort::GpuModel, "gpu"),
        (NodeSort::Health, "health"),
        (NodeSort::Models, "models"),
    ];

    /// The order the address names; by name where it names none it knows.
    pub fn parse(text: &str) -> NodeSort {
        NodeSort::ALL
            .iter()
            .find(|(_, name)| *name == text)
            .map_or(NodeSort::Name, |(sort, _)| *sort)
    }

    /// How the address spells it.
    pub fn as_str(self) -> &'static str {
        NodeSort::ALL
            .iter()
            .find(|(sort, _)| *sort == self)
            .map_or("name", |(_, name)| name)
    }

    fn order(self, rows: &mut [NodeRow]) {
        match self {
            NodeSort::Name => rows.sort_by(|a, b| a.name.cmp(&b.name)),
            NodeSort::Free => rows.sort_by(|a, b| b.free.cmp(&a.free).then(a.name.cmp(&b.name))),
            NodeSort::GpuModel => {
                rows.sort_by(|a, b| a.gpu_model.cmp(&b.gpu_model).then(a.name.cmp(&b.name)))
            }
            NodeSort::Health => {
                rows.sort_by(|a, b| b.unhealthy().cmp(&a.unhealthy()).then(a.name.cmp(&b.name)))
            }
            NodeSort::Models => rows.sort_by(|a, b| {
                b.models
                    .len()
                    .cmp(&a.models.len())
                    .then(a.name.cmp(&b.name))
            }),
        }
    }
}

/// One page of the Nodes tab.
pub type NodesPage = Page<NodeRow>;

impl Page<NodeRow> {
    /// Page `page` (from 1; past the last is the last) of `rows` whose node, group or model holds
    /// `search` (any case), sorted by `sort`.
    pub fn nodes(mut rows: Vec<NodeRow>, search: &str, page: usize, sort: NodeSort) -> NodesPage {
        let needle = search.trim().to_lowercase();
        sort.order(&mut rows);
        Page::of(rows, |row| needle.is_empty() || row.holds(&needle), page)
    }
}

impl NodeRow {
    /// Its unhealthy GPUs.
    pub fn unhealthy(&self) -> usize {
        self.cells.iter().filter(|c| !c.healthy).count()
    }

    /// Whether its name, a group or a model holds `needle` (lower case).
    fn holds(&self, needle: &str) -> bool {
        self.name.to_lowercase().contains(needle)
            || self
                .groups
                .iter()
                .any(|g| g.to_lowercase().contains(needle))
            || self
                .models
                .iter()
                .any(|m| m.name.to_lowercase().contains(needle))
    }

    /// `2 of 2 shareable · 180 GB free (94%)`: the percentage is of all the node's GPU memory.
    pub fn summary(&self) -> String {
        let percent = if self.total == Bytes::ZERO {
            0
        } else {
            // Rounded half up, in integers.
            (u128::from(self.free.get()) * 200 + u128::from(self.total.get()))
                / (2 * u128::from(self.total.get()))
        };
        format!(
            "{} of {} shareable · {} free ({percent}%)",
            self.shareable, self.gpus, self.free
        )
    }
}

/// Who holds a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuUse {
    /// Nobody.
    Free,
    /// One worker or model, whole.
    Whole(String),
    /// Shared work, by memory.
    Shared,
}

/// One sharer of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharer {
    /// The worker, or the group's model.
    pub name: String,
    /// The group, for a group's model.
    pub group: Option<String>,
    /// What it takes.
    pub bytes: Bytes,
}

/// A GPU on the machine page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDetail {
    /// Its index on the machine.
    pub index: u32,
    /// Its model name.
    pub model: String,
    /// Its UUID.
    pub uuid: String,
    /// Whether it is healthy.
    pub healthy: bool,
    /// All its memory.
    pub total: Bytes,
    /// Memory something outside Tessera holds.
    pub held_outside: Bytes,
    /// Who holds it.
    pub usage: GpuUse,
    /// Its sharers, largest first as the server lists them.
    pub sharers: Vec<Sharer>,
    /// The seed's line: `shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken`.
    pub summary: Option<String>,
    /// Its sharers slowed by their neighbours here: `glm-5.3: Slowed by its neighbours: …`.
    #[serde(default)]
    pub slowed: Vec<String>,
    /// How it is shared, which says whether a share is enforced or a promise.
    #[serde(default)]
    pub sharing: placement::sharing::GpuSharing,
    /// Its sharers measured using more than their share here, each in words.
    #[serde(default)]
    pub over_share: Vec<String>,
    /// Its readings of the last hour, oldest first.
    #[serde(default)]
    pub history: Vec<GpuPoint>,
    /// Those are the demo fleet's, made from its demo engines' work, not read from a driver.
    #[serde(default)]
    pub demo_figures: bool,
    /// It is made up (the demo fleet's, or a Ray node's labelled demo): demo engines stand in for what
    /// would run there, and no MPS daemon runs.
    #[serde(default)]
    pub made_up: bool,
    /// Its part in MIG: cut into instances, or one of them.
    #[serde(default)]
    pub mig: Option<placement::MigRole>,
    /// Why the last reading found it unhealthy, where it said why.
    #[serde(default)]
    pub problem: Option<String>,
}

/// One reading of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPoint {
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// Percent of the period in which a kernel ran.
    pub utilisation_percent: u32,
    /// Memory in use by anyone.
    pub used: Option<Bytes>,
    /// Of that, what is held outside Tessera; the rest is Tessera's engines'.
    pub held_outside: Option<Bytes>,
    /// Temperature, °C.
    pub temperature_c: Option<u32>,
    /// Power draw, mW.
    pub power_mw: Option<u32>,
}

impl GpuPoint {
    /// The machine page's line for the latest reading: `34% busy · 30.1 of 96 GB in use (28 GB by
    /// Tessera's engines, 2.1 GB by others) · 45 °C · 210 W`.
    pub fn line(&self, total: Bytes) -> String {
        let mut parts = vec![format!("{}% busy", self.utilisation_percent)];
        if let Some(used) = self.used {
            let outside = self.held_outside.unwrap_or_default().min(used);
            parts.push(format!(
                "{} of {} in use ({} by Tessera's engines, {} by others)",
                used.gb_text(),
                total,
                used.saturating_sub(outside),
                outside
            ));
        }
        if let Some(c) = self.temperature_c {
            parts.push(format!("{c} °C"));
        }
        if let Some(mw) = self.power_mw {
            parts.push(format!("{} W", mw / 1000));
        }
        parts.join(" · ")
    }
}

/// What MIG would make of a GPU's sharers (seed 004): each in an instance of its own, or why no layout
/// holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigPlan {
    /// The layout, and what it takes.
    Layout {
        /// Each instance: `embedder on 1g.18gb (slices 4–4, 16 GB)`.
        instances: Vec<String>,
        /// The slices it leaves: `2 of 8 memory slices and 2 of 7 compute slices left.`
        left: String,
        /// What must stop before it can be applied.
        stop_first: String,
        /// The commands that create it.
        commands: Vec<String>,
    },
    /// Why none holds them, in words a person can check against the menu.
    None(String),
}

impl GpuDetail {
    /// How it is shared, in words; on a made-up GPU, where no MPS daemon runs, said so.
    pub fn sharing_line(&self) -> String {
        let line = self.sharing.line();
        if self.made_up && self.sharing.mode != placement::sharing::Sharing::TimeSlicing {
            format!("{line} This GPU is made up, so no daemon runs: the demo engines stand in.")
        } else {
            line
        }
    }

    /// How the machine page heads it: `GPU 0 · NVIDIA H200`, or for a MIG instance the GPU it is cut from,
    /// `MIG instance 1 of GPU 0 · NVIDIA H200 MIG 3g.71gb`.
    pub fn title(&self) -> String {
        match placement::mig::instance_of(self.index) {
            Some((parent, n)) if self.mig.is_some() => {
                format!("MIG instance {n} of GPU {parent} · {}", self.model)
            }
            _ => format!("GPU {} · {}", self.index, self.model),
        }
    }

    /// What MIG makes of it, where it has a part in MIG.
    pub fn mig_line(&self) -> Option<&'static str> {
        match self.mig.as_ref()? {
            placement::MigRole::Cut => Some("Cut into MIG instances: work runs in those, each a GPU of its own below, and none on this GPU itself."),
            placement::MigRole::Instance { .. } => Some("A MIG instance, with memory and compute walls of its own: one engine holds it whole."),
        }
    }

    /// What MIG would make of its sharers, where its model has MIG and it is shared.
    pub fn mig_plan(&self) -> Option<MigPlan> {
        let menu = placement::mig::menu(&self.model)?;
        if self.sharers.is_empty() {
            return None;
        }
        let tenants: Vec<placement::mig::Tenant> = self
            .sharers
            .iter()
            .map(|s| placement::mig::Tenant::new(s.name.clone(), s.bytes))
            .collect();
        Some(match placement::mig::plan(menu, &tenants) {
            Err(why) => MigPlan::None(why.to_string()),
            Ok(layout) => {
                let names: Vec<&str> = self.sharers.iter().map(|s| s.name.as_str()).collect();
                MigPlan::Layout {
                    instances: layout.instances.iter().map(ToString::to_string).collect(),
                    left: format!(
                        "{} of 8 memory slices and {} of 7 compute slices left.",
                        layout.free_slices(),
                        layout.free_compute()
                    ),
                    stop_first: format!(
                        "A layout is made on an idle GPU, with MIG mode on (which may reset it): {} must stop first.",
                        names.join(", ")
                    ),
                    commands: layout.commands(self.index),
                }
            }
        })
    }

    /// What it offers Tessera: [`placement::offered`].
    pub fn offered(&self) -> Bytes {
        placement::offered(self.total, self.held_outside, self.mig.as_ref())
    }

    /// What its sharers take.
    pub fn taken(&self) -> Bytes {
        self.sharers.iter().map(|s| s.bytes).sum()
    }

    /// `Offers 7 of its 8 GB (1 GB held outside Tessera)`, or `Offers all of its 96 GB`.
    pub fn offer_text(&self) -> String {
        if self.mig == Some(placement::MigRole::Cut) {
            format!(
                "Offers nothing itself: its {} are its MIG instances'",
                self.total
            )
        } else if self.held_outside == Bytes::ZERO {
            format!("Offers all of its {}", self.total)
        } else {
            format!(
                "Offers {} of its {} ({} held outside Tessera)",
                self.offered().gb_text(),
                self.total,
                self.held_outside
            )
        }
    }
}

/// A worker or model placed on the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLine {
    /// Its name.
    pub name: String,
    /// The sharing group, for a group's model.
    pub group: Option<String>,
    /// The GPU indices it holds here.
    pub gpus: Vec<u32>,
    /// What it takes on each, when shared.
    pub shared: Option<Bytes>,
    /// Its engine's state.
    pub status: Option<EngineState>,
    /// Its engine's word on that state where it is not serving: a loading engine's progress, as its own
    /// log prints it, or why it failed.
    #[serde(default)]
    pub message: Option<String>,
}

impl WorkerLine {
    /// The GPUs column: `1 · shared 2.2 GB`, or `2 · whole`.
    pub fn gpus_text(&self) -> String {
        match self.shared {
            Some(bytes) => format!("{} · shared {bytes}", self.gpus.len()),
            None => format!("{} · whole", self.gpus.len()),
        }
    }
}

/// A worker that waits, with its reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingLine {
    /// Its name.
    pub name: String,
    /// One sentence per GPU or machine, in the seed's words.
    pub reasons: Vec<String>,
}

/// The machine page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineDetail {
    /// Its name.
    pub name: String,
    /// CPU cores.
    pub cpu_cores: u32,
    /// CPU cores its workers hold.
    pub cpu_cores_used: u32,
    /// Memory.
    pub memory: Bytes,
    /// Memory its workers hold.
    pub memory_used: Bytes,
    /// A Windows PC under WSL2: shared work takes its memory on every GPU.
    pub all_gpus_visible: bool,
    /// Its GPUs.
    pub gpus: Vec<GpuDetail>,
    /// What runs here.
    pub workers: Vec<WorkerLine>,
    /// Workers that wait anywhere, with the reasons about this machine.
    pub pending: Vec<PendingLine>,
    /// Since when (RFC 3339) the machine's Ray node has been dead or gone, if it is.
    #[serde(default)]
    pub unreachable_since: Option<String>,
}

impl MachineDetail {
    /// Its GPUs as the page lists them: each followed by the MIG instances cut from it.
    pub fn gpus_in_order(&self) -> Vec<GpuDetail> {
        let mut gpus = self.gpus.clone();
        gpus.sort_by_key(|g| match &g.mig {
            Some(placement::MigRole::Instance { parent, .. }) => (*parent, g.index),
            _ => (g.index, 0),
        });
        gpus
    }
}

/// A GPU's sharing setting as committed, and the engines that restart for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingChange {
    /// The GPU, as `machine:index`.
    pub gpu: String,
    /// How it is shared now.
    pub sharing: placement::sharing::GpuSharing,
    /// The engines that restart, its sharers, each stopped before it starts again (none when nothing
    /// changed).
    pub restarts: Vec<String>,
}

impl SharingChange {
    /// What the console says once it is committed.
    pub fn line(&self) -> String {
        let way = match self.sharing.mode {
            placement::sharing::Sharing::TimeSlicing => "time-sliced",
            placement::sharing::Sharing::Mps => "under MPS",
            placement::sharing::Sharing::Mig => {
                return format!(
                    "{} is cut into MIG instances, each a GPU of its own held whole.",
                    self.gpu
                )
            }
        };
        match self.restarts.as_slice() {
            [] => format!("{} is shared {way}; nothing restarts.", self.gpu),
            names => format!(
                "{} is shared {way}; restarting {}, each stopped before it starts again.",
                self.gpu,
                names.join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, model: &str) -> NodeRow {
        NodeRow {
            name: name.into(),
            groups: vec![format!("{model}-group")],
            models: vec![NodeModel {
                name: model.into(),
                share: None,
            }],
            gpus: 8,
            shareable: 8,
            total: Bytes::gb(640),
            free: Bytes::gb(640),
            cells: Vec::new(),
            gpu_model: "NVIDIA H100 80GB HBM3".into(),
        }
    }

    #[test]
    fn the_nodes_tab_finds_a_node_by_its_name_group_or_model_and_pages_the_rest() {
        let rows: Vec<NodeRow> = (0..1250)
            .map(|i| {
                node(
                    &format!("gpu-{i:04}"),
                    if i == 777 { "Whisper" } else { "embed" },
                )
            })
            .collect();
        let first = NodesPage::nodes(rows.clone(), "", 1, NodeSort::Name);
        assert_eq!(
            (first.rows.len(), first.matching, first.pages),
            (50, 1250, 25)
        );
        let last = NodesPage::nodes(rows.clone(), "", 99, NodeSort::Name);
        assert_eq!(
            (last.page, last.rows[0].name.as_str()),
            (25, "gpu-1200"),
            "past the last is the last"
        );
        let by_model = NodesPage::nodes(rows.clone(), "whisper", 1, NodeSort::Name);
        assert_eq!(
            (by_model.matching, by_model.rows[0].name.as_str()),
            (1, "gpu-0777")
        );
        let by_name = NodesPage::nodes(rows.clone(), " GPU-12 ", 1, NodeSort::Name);
        assert_eq!(by_name.matching, 50, "gpu-1200 to gpu-1249");
        let none = NodesPage::nodes(rows, "nothing", 3, NodeSort::Name);
        assert_eq!(
            (none.matching, none.page, none.pages, none.all),
            (0, 1, 1, 1250)
        );
    }

    #[test]
    fn the_nodes_tab_sorts_by_free_memory_gpu_model_health_or_models_then_by_name() {
        let cell = |healthy| GpuCell {
            total: Bytes::gb(80),
            taken: Bytes::ZERO,
            outside: Bytes::ZERO,
            whole: false,
            healthy,
        };
        let mut a = node("a", "embed");
        a.free = Bytes::gb(10);
        a.gpu_model = "NVIDIA L4".into();
        a.cells = vec![cell(true), cell(false)];
        let mut b = node("b", "embed");
        b.free = Bytes::gb(300);
        b.models.push(NodeModel {
            name: "speech".into(),
            share: None,
        });
        b.cells = vec![cell(true)];
        let mut c = node("c", "embed");
        c.free = Bytes::gb(300);
        c.cells = vec![cell(false), cell(false)];
        let rows = vec![c, a, b];
        let order = |sort| -> Vec<String> {
            NodesPage::nodes(rows.clone(), "", 1, sort)
                .rows
                .into_iter()
                .map(|r| r.name)
                .collect()
        };
        assert_eq!(order(NodeSort::Name), ["a", "b", "c"]);
        assert_eq!(order(NodeSort::Free), ["b", "c", "a"]);
        assert_eq!(order(NodeSort::GpuModel), ["b", "c", "a"]);
        assert_eq!(order(NodeSort::Health), ["c", "a", "b"]);
        assert_eq!(order(NodeSort::Models), ["b", "a", "c"]);
        assert_eq!(NodeSort::parse("free"), NodeSort::Free);
        assert_eq!(NodeSort::parse("anything else"), NodeSort::Name);
        assert!(NodeSort::ALL
            .iter()
            .all(|(sort, name)| NodeSort::parse(name) == *sort && sort.as_str() == *name));
    }

    /// A healthy, free, time-sliced GPU of `model` with `total` memory and nothing said about it.
    fn gpu_detail(model: &str, total: Bytes) -> GpuDetail {
        GpuDetail {
            index: 0,
            model: model.into(),
            uuid: String::new(),
            healthy: true,
            total,
            held_outside: Bytes::ZERO,
            usage: GpuUse::Free,
            sharers: Vec::new(),
            summary: None,
            slowed: Vec::new(),
            sharing: placement::sharing::GpuSharing::default(),
            over_share: Vec::new(),
            history: Vec::new(),
            demo_figures: false,
            made_up: false,
            mig: None,
            problem: None,
        }
    }

    #[test]
    fn a_node_reads_as_the_seed_writes_it() {
        // Two 96 GB GPUs with 6 GB taken on each: 180 of 192 GB free, 93.75 % shown as 94 %.
        let node = NodeRow {
            name: "atlas".into(),
            groups: vec!["text-router".into()],
            models: Vec::new(),
            gpus: 2,
            shareable: 2,
            total: Bytes::gb(192),
            free: Bytes::gb(180),
            cells: Vec::new(),
            gpu_model: "NVIDIA RTX PRO 6000".into(),
        };
        assert_eq!(node.summary(), "2 of 2 shareable · 180 GB free (94%)");
    }

    #[test]
    fn the_gpus_column_counts_gpus_and_says_the_share() {
        let line = WorkerLine {
            name: "listen".into(),
            group: None,
            gpus: vec![0],
            shared: Some(Bytes(2_362_232_013)),
            status: None,
            message: None,
        };
        assert_eq!(line.gpus_text(), "1 · shared 2.2 GB");
    }

    #[test]
    fn an_h200_shows_the_mig_layout_its_sharers_would_take_and_what_must_stop_first() {
        let sharer = |name: &str, gb: u64| Sharer {
            name: name.into(),
            group: None,
            bytes: Bytes::gb(gb),
        };
        let mut gpu = GpuDetail {
            index: 2,
            usage: GpuUse::Shared,
            sharers: vec![sharer("small-llm", 45), sharer("embedder", 8)],
            ..gpu_detail("NVIDIA H200", Bytes::gb(141))
        };
        assert_eq!(
            gpu.mig_plan(),
            Some(MigPlan::Layout {
                instances: vec![
                    "small-llm on 3g.71gb (slices 0–3, 69.8 GB)".into(),
                    "embedder on 1g.18gb (slices 4–4, 16 GB)".into(),
                ],
                left: "3 of 8 memory slices and 3 of 7 compute slices left.".into(),
                stop_first: "A layout is made on an idle GPU, with MIG mode on (which may reset it): small-llm, embedder must stop first.".into(),
                commands: vec![
                    "nvidia-smi mig -i 2 -cgi 9:0 -C".into(),
                    "nvidia-smi mig -i 2 -cgi 19:4 -C".into(),
                ],
            })
        );
        gpu.sharers.push(sharer("big", 100));
        assert_eq!(
            gpu.mig_plan(),
            Some(MigPlan::None(
                "big needs 100 GB: only 7g.141gb holds that much, and it takes the whole GPU, leaving no slice for small-llm and embedder.".into()
            ))
        );
        gpu.model = "NVIDIA GeForce RTX 4090".into();
        assert_eq!(gpu.mig_plan(), None);
    }

    #[test]
    fn a_mig_instance_is_headed_by_the_gpu_it_is_cut_from_and_says_it_is_held_whole() {
        let instance = GpuDetail {
            index: placement::mig::instance_index(2, 1),
            mig: Some(placement::MigRole::Instance {
                parent: 2,
                profile: "3g.71gb".into(),
            }),
            ..gpu_detail("NVIDIA H200 MIG 3g.71gb", Bytes(71424 << 20))
        };
        assert_eq!(
            instance.title(),
            "MIG instance 1 of GPU 2 · NVIDIA H200 MIG 3g.71gb"
        );
        assert_eq!(
            instance.mig_line(),
            Some("A MIG instance, with memory and compute walls of its own: one engine holds it whole.")
        );
        let cut = GpuDetail {
            index: 2,
            mig: Some(placement::MigRole::Cut),
            ..gpu_detail("NVIDIA H200", Bytes::gb(141))
        };
        assert_eq!(cut.title(), "GPU 2 · NVIDIA H200");
        assert_eq!(cut.offered(), Bytes::ZERO);
        assert_eq!(
            cut.offer_text(),
            "Offers nothing itself: its 141 GB are its MIG instances'"
        );
        assert_eq!(
            cut.mig_line(),
            Some("Cut into MIG instances: work runs in those, each a GPU of its own below, and none on this GPU itself.")
        );
        assert_eq!(gpu_detail("NVIDIA H200", Bytes::gb(141)).mig_line(), None);
    }

    #[test]
    fn a_gpu_under_mps_says_its_shares_are_enforced_and_on_a_made_up_gpu_that_no_daemon_runs() {
        let mut gpu = GpuDetail {
            usage: GpuUse::Shared,
            demo_figures: true,
            made_up: true,
            ..gpu_detail("NVIDIA H200", Bytes::gb(141))
        };
        assert_eq!(
            gpu.sharing_line(),
            "Time-sliced: each share is a promise the engine keeps by sizing itself."
        );
        gpu.sharing.mode = placement::sharing::Sharing::Mps;
        assert_eq!(
            gpu.sharing_line(),
            "MPS: the driver holds each engine to its memory share. This GPU is made up, so no daemon runs: the demo engines stand in."
        );
        gpu.made_up = false;
        assert_eq!(
            gpu.sharing_line(),
            "MPS: the driver holds each engine to its memory share."
        );
    }

    #[test]
    fn a_gpu_says_what_it_offers_and_what_is_held_outside() {
        let gpu = GpuDetail {
            held_outside: Bytes::gb(1),
            ..gpu_detail("NVIDIA GeForce RTX 4060", Bytes::gb(8))
        };
        let reading = GpuPoint {
            at_ms: 0,
            utilisation_percent: 34,
            used: Some(Bytes::from_gb(4.5).unwrap()),
            held_outside: Some(Bytes::gb(1)),
            temperature_c: Some(45),
            power_mw: Some(110_500),
        };
        assert_eq!(
            reading.line(gpu.total),
            "34% busy · 4.5 of 8 GB in use (3.5 GB by Tessera's engines, 1 GB by others) · 45 °C · 110 W"
        );
        assert_eq!(
            gpu.offer_text(),
            "Offers 7 of its 8 GB (1 GB held outside Tessera)"
        );
    }
}
