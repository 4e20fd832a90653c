//! MIG (seed 004): a GPU cut into up to seven instances from its model's fixed menu, each a smaller GPU of
//! its own with walls. The planner takes the models meant for one GPU and proposes the layout that fits
//! them in the fewest slices, or says why none does in words a person can check against the menu.
//!
//! A GPU has eight memory slices and seven compute slices. A profile such as `3g.40gb` takes three compute
//! slices and four memory slices, and may start only at certain memory slices (its placements), as
//! `nvidia-smi mig -lgipp` lists them. Where drivers report an instance's memory differently, the lower
//! figure is taken: a plan that leaves a little unused beats one that overfills. The sources are in
//! docs/src/design/nvidia.md.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

pub use crate::inventory::{instance_index, instance_of};

/// Memory slices of a MIG-capable GPU.
pub const MEMORY_SLICES: u8 = 8;
/// Compute slices of a MIG-capable GPU.
pub const COMPUTE_SLICES: u8 = 7;

/// One size on a GPU's menu.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// Its name, such as `3g.40gb`.
    pub name: &'static str,
    /// The GPU instance profile id `nvidia-smi mig -cgi` takes.
    pub id: u32,
    /// Compute slices.
    pub compute: u8,
    /// Memory slices.
    pub slices: u8,
    /// Memory an instance offers, in MiB, as the driver reports it.
    pub memory_mib: u64,
    /// The memory slices an instance may start at.
    pub starts: &'static [u8],
}

impl Profile {
    /// Memory an instance offers.
    pub fn memory(&self) -> Bytes {
        Bytes(self.memory_mib << 20)
    }

    /// Whether it takes the whole GPU.
    pub fn is_whole(&self) -> bool {
        self.compute == COMPUTE_SLICES
    }
}

/// The profiles of one GPU model, smallest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Menu {
    /// The GPU, as the console names it.
    pub gpu: &'static str,
    /// Its profiles.
    pub profiles: &'static [Profile],
}

const SEVEN: &[u8] = &[0, 1, 2, 3, 4, 5, 6];
const FOUR: &[u8] = &[0, 2, 4, 6];
const THREE: &[u8] = &[0, 2, 4];
const TWO: &[u8] = &[0, 4];
const ONE: &[u8] = &[0];

const fn profile(
    name: &'static str,
    id: u32,
    compute: u8,
    slices: u8,
    memory_mib: u64,
    starts: &'static [u8],
) -> Profile {
    Profile {
        name,
        id,
        compute,
        slices,
        memory_mib,
        starts,
    }
}

/// A100 40GB.
pub const A100_40GB: Menu = Menu {
    gpu: "A100 40GB",
    profiles: &[
        profile("1g.5gb", 19, 1, 1, 4864, SEVEN),
        profile("1g.10gb", 15, 1, 2, 9856, FOUR),
        profile("2g.10gb", 14, 2, 2, 9856, THREE),
        profile("3g.20gb", 9, 3, 4, 19968, TWO),
        profile("4g.20gb", 5, 4, 4, 19968, ONE),
        profile("7g.40gb", 0, 7, 8, 40192, ONE),
    ],
};

/// A100 80GB.
pub const A100_80GB: Menu = Menu {
    gpu: "A100 80GB",
    profiles: &[
        profile("1g.10gb", 19, 1, 1, 9984, SEVEN),
        profile("1g.20gb", 15, 1, 2, 19968, FOUR),
        profile("2g.20gb", 14, 2, 2, 19968, THREE),
        profile("3g.40gb", 9, 3, 4, 40192, TWO),
        profile("4g.40gb", 5, 4, 4, 40192, ONE),
        profile("7g.80gb", 0, 7, 8, 80384, ONE),
    ],
};

/// H100 80GB.
pub const H100_80GB: Menu = Menu {
    gpu: "H100 80GB",
    profiles: &[
        profile("1g.10gb", 19, 1, 1, 9984, SEVEN),
        profile("1g.20gb", 15, 1, 2, 20096, FOUR),
        profile("2g.20gb", 14, 2, 2, 20096, THREE),
        profile("3g.40gb", 9, 3, 4, 40448, TWO),
        profile("4g.40gb", 5, 4, 4, 40448, ONE),
        profile("7g.80gb", 0, 7, 8, 81152, ONE),
    ],
};

/// H200 141GB.
pub const H200_141GB: Menu = Menu {
    gpu: "H200 141GB",
    profiles: &[
        profile("1g.18gb", 19, 1, 1, 16384, SEVEN),
        profile("1g.35gb", 15, 1, 2, 33280, FOUR),
        profile("2g.35gb", 14, 2, 2, 33280, THREE),
        profile("3g.71gb", 9, 3, 4, 71424, TWO),
        profile("4g.71gb", 5, 4, 4, 71424, ONE),
        profile("7g.141gb", 0, 7, 8, 142336, ONE),
    ],
};

/// The menu of a GPU model as NVML names it (`NVIDIA H100 80GB HBM3`, `NVIDIA A100-SXM4-40GB`), if it has
/// MIG and Tessera knows its menu.
pub fn menu(model: &str) -> Option<&'static Menu> {
    let model = model.to_ascii_uppercase();
    if model.contains("H200") {
        Some(&H200_141GB)
    } else if model.contains("H100") && model.contains("80GB") {
        Some(&H100_80GB)
    } else if model.contains("A100") && model.contains("80GB") {
        Some(&A100_80GB)
    } else if model.contains("A100") && model.contains("40GB") {
        Some(&A100_40GB)
    } else {
        None
    }
}

/// The profile of a MIG device as NVML names it (`NVIDIA H100 80GB HBM3 MIG 3g.40gb`).
pub fn profile_in_name(name: &str) -> Option<&str> {
    name.rsplit_once(" MIG ")
        .map(|(_, profile)| profile.trim())
        .filter(|p| !p.is_empty())
}

/// How NVML names a MIG device cut as `profile` from a GPU named `model`.
pub fn instance_name(model: &str, profile: &str) -> String {
    format!("{model} MIG {profile}")
}

/// The GPU model in a name as NVML gives it: a MIG device's without its profile, a GPU's as it is.
pub fn model_in_name(name: &str) -> &str {
    match profile_in_name(name) {
        Some(profile) => name
            .strip_suffix(&format!(" MIG {profile}"))
            .unwrap_or(name),
        None => name,
    }
}

/// Instance `n` of `parent`, cut as `profile`, as the driver lists it: a GPU of its own, numbered under
/// its GPU, named and sized by its profile, with nothing held outside.
pub fn instance(parent: &crate::Gpu, n: u32, profile: &Profile, uuid: String) -> crate::Gpu {
    crate::Gpu {
        index: instance_index(parent.index, n),
        uuid,
        model: instance_name(&parent.model, profile.name),
        total: profile.memory(),
        held_outside: Bytes::ZERO,
        mig: Some(crate::MigRole::Instance {
            parent: parent.index,
            profile: profile.name.to_owned(),
        }),
        ..parent.clone()
    }
}

/// A model meant for the GPU and the memory it needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tenant {
    /// The model.
    pub name: String,
    /// GPU memory it needs.
    pub memory: Bytes,
}

impl Tenant {
    /// `name` needing `memory`.
    pub fn new(name: impl Into<String>, memory: Bytes) -> Tenant {
        Tenant {
            name: name.into(),
            memory,
        }
    }
}

/// One instance of a layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placed {
    /// The model it holds.
    pub tenant: String,
    /// Its profile.
    pub profile: Profile,
    /// The memory slice it starts at.
    pub start: u8,
}

/// A MIG layout for one GPU: an instance per model, by start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// The GPU's menu.
    pub gpu: &'static str,
    /// The instances, by start slice.
    pub instances: Vec<Placed>,
}

impl Layout {
    /// Its instances' profiles by name, in order, as they are stored.
    pub fn profiles(&self) -> Vec<String> {
        self.instances
            .iter()
            .map(|p| p.profile.name.to_owned())
            .collect()
    }

    /// Memory slices no instance takes.
    pub fn free_slices(&self) -> u8 {
        MEMORY_SLICES - self.instances.iter().map(|p| p.profile.slices).sum::<u8>()
    }

    /// Compute slices no instance takes.
    pub fn free_compute(&self) -> u8 {
        COMPUTE_SLICES - self.instances.iter().map(|p| p.profile.compute).sum::<u8>()
    }

    /// The commands that create it on GPU `index` once MIG mode is on and the GPU runs nothing: each GPU
    /// instance at its placement, with its default compute instance.
    pub fn commands(&self, index: u32) -> Vec<String> {
        self.create_args(index)
            .into_iter()
            .map(|args| format!("nvidia-smi {}", args.join(" ")))
            .collect()
    }

    /// [`Layout::commands`]' arguments to `nvidia-smi`, one list per instance.
    pub fn create_args(&self, index: u32) -> Vec<Vec<String>> {
        self.instances
            .iter()
            .map(|p| {
                vec![
                    "mig".to_owned(),
                    "-i".to_owned(),
                    index.to_string(),
                    "-cgi".to_owned(),
                    format!("{}:{}", p.profile.id, p.start),
                    "-C".to_owned(),
                ]
            })
            .collect()
    }
}

/// Why no layout holds the models, in words a person can check against the menu.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoLayout {
    /// The GPU has no MIG menu Tessera knows.
    #[error("{model} has no MIG profiles Tessera knows: MIG runs on A100, H100 and H200.")]
    NoMenu {
        /// The GPU model.
        model: String,
    },
    /// Nothing to place.
    #[error("Name at least one model for the GPU.")]
    Nothing,
    /// More models than instances.
    #[error("An {gpu} holds at most 7 MIG instances; {asked} models were asked for.")]
    TooMany {
        /// The menu's GPU.
        gpu: &'static str,
        /// Models asked for.
        asked: usize,
    },
    /// A model larger than the largest instance.
    #[error(
        "{tenant} needs {needs} GB; the largest instance of an {gpu}, {profile}, holds {holds} GB."
    )]
    TooBig {
        /// The menu's GPU.
        gpu: &'static str,
        /// The model.
        tenant: String,
        /// What it needs.
        needs: String,
        /// The largest profile.
        profile: &'static str,
        /// What that holds.
        holds: String,
    },
    /// A model only the whole-GPU instance holds, beside others.
    #[error("{tenant} needs {needs} GB: only {profile} holds that much, and it takes the whole GPU, leaving no slice for {others}.")]
    WholeGpu {
        /// The model.
        tenant: String,
        /// What it needs.
        needs: String,
        /// The whole-GPU profile.
        profile: &'static str,
        /// The other models, listed.
        others: String,
    },
    /// No instance named.
    #[error("Name at least one instance, such as 3g.40gb.")]
    NoInstance,
    /// A profile the GPU's menu does not have.
    #[error("An {gpu} has no MIG profile {profile:?}; its menu is {menu}.")]
    UnknownProfile {
        /// The menu's GPU.
        gpu: &'static str,
        /// The name given.
        profile: String,
        /// The names it has.
        menu: String,
    },
    /// Instances named that take more slices than the GPU has.
    #[error("An {gpu} has 7 compute and 8 memory slices (and at most 7 instances); these take {compute} and {slices}: {list}, each as compute+memory.")]
    OverSlices {
        /// The menu's GPU.
        gpu: &'static str,
        /// Compute slices they take.
        compute: u8,
        /// Memory slices they take.
        slices: u8,
        /// Each profile with its slices.
        list: String,
    },
    /// Instances named whose placements on the menu cannot put them side by side.
    #[error("An {gpu}'s placements cannot put these instances side by side: {list}, each as compute+memory slices.")]
    NoPlacement {
        /// The menu's GPU.
        gpu: &'static str,
        /// Each profile with its slices.
        list: String,
    },
    /// The smallest instances that hold the models take more memory slices than the GPU has.
    #[error("The smallest instances that hold these models take {needed} of the GPU's 8 memory slices: {list}.")]
    MemorySlices {
        /// Slices needed.
        needed: u8,
        /// Each model, its smallest profile and its slices.
        list: String,
    },
}

/// The layout of named profiles on a GPU of `model` (as NVML names it): [`layout_of`] on its menu, or that it
/// has none.
pub fn layout_for(model: &str, profiles: &[String]) -> Result<Layout, NoLayout> {
    let menu = menu(model).ok_or_else(|| NoLayout::NoMenu {
        model: model.to_owned(),
    })?;
    layout_of(menu, profiles)
}

/// The layout of `menu`'s GPU with an instance of each profile named (by name, such as `3g.40gb`), at the
/// placements that leave the most room beside them; or why the menu cannot hold them.
pub fn layout_of(menu: &'static Menu, profiles: &[String]) -> Result<Layout, NoLayout> {
    if profiles.is_empty() {
        return Err(NoLayout::NoInstance);
    }
    let mut options = Vec::with_capacity(profiles.len());
    for (t, name) in profiles.iter().enumerate() {
        let Some(profile) = menu.profiles.iter().find(|p| p.name == name.trim()) else {
            return Err(NoLayout::UnknownProfile {
                gpu: menu.gpu,
                profile: name.clone(),
                menu: menu
                    .profiles
                    .iter()
                    .map(|p| p.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        options.push((t, vec![profile]));
    }
    let named: Vec<Tenant> = options
        .iter()
        .map(|(_, p)| Tenant::new(p[0].name, p[0].memory()))
        .collect();
    let list = options
        .iter()
        .map(|(_, p)| format!("{} ({}+{})", p[0].name, p[0].compute, p[0].slices))
        .collect::<Vec<_>>()
        .join(", ");
    let compute: u8 = options.iter().map(|(_, p)| p[0].compute).sum();
    let slices: u8 = options.iter().map(|(_, p)| p[0].slices).sum();
    if options.len() > usize::from(COMPUTE_SLICES)
        || compute > COMPUTE_SLICES
        || slices > MEMORY_SLICES
    {
        return Err(NoLayout::OverSlices {
            gpu: menu.gpu,
            compute,
            slices,
            list,
        });
    }
    search(menu, &named, options).ok_or(NoLayout::NoPlacement {
        gpu: menu.gpu,
        list,
    })
}

/// The layout of `menu`'s GPU that gives each tenant its own instance with the memory it needs, taking the
/// fewest memory slices and then the fewest compute slices, so the most is left for later.
pub fn plan(menu: &'static Menu, tenants: &[Tenant]) -> Result<Layout, NoLayout> {
    if tenants.is_empty() {
        return Err(NoLayout::Nothing);
    }
    if tenants.len() > usize::from(COMPUTE_SLICES) {
        return Err(NoLayout::TooMany {
            gpu: menu.gpu,
            asked: tenants.len(),
        });
    }
    let largest = menu
        .profiles
        .iter()
        .max_by_key(|p| p.memory_mib)
        .expect("a menu has profiles");
    // Each tenant's profiles that hold it, fewest slices first.
    let mut options: Vec<(usize, Vec<&'static Profile>)> = Vec::with_capacity(tenants.len());
    for (t, tenant) in tenants.iter().enumerate() {
        let mut fitting: Vec<&'static Profile> = menu
            .profiles
            .iter()
            .filter(|p| p.memory() >= tenant.memory)
            .collect();
        if fitting.is_empty() {
            return Err(NoLayout::TooBig {
                gpu: menu.gpu,
                tenant: tenant.name.clone(),
                needs: tenant.memory.gb_text(),
                profile: largest.name,
                holds: largest.memory().gb_text(),
            });
        }
        fitting.sort_by_key(|p| (p.slices, p.compute, p.memory_mib));
        options.push((t, fitting));
    }
    search(menu, tenants, options.clone()).ok_or_else(|| why_not(tenants, &options))
}

/// The layout that takes the fewest memory and then compute slices, each tenant on one of its options.
fn search(
    menu: &'static Menu,
    tenants: &[Tenant],
    mut options: Vec<(usize, Vec<&'static Profile>)>,
) -> Option<Layout> {
    // The most constrained first: the largest smallest fit.
    options.sort_by_key(|(_, fitting)| std::cmp::Reverse((fitting[0].slices, fitting[0].compute)));
    let mut search = LayoutSearch {
        options: &options,
        used: [false; MEMORY_SLICES as usize],
        compute: 0,
        slices: 0,
        chosen: Vec::new(),
        best: None,
    };
    search.dfs(0);
    let (_, chosen) = search.best?;
    let mut instances: Vec<Placed> = chosen
        .into_iter()
        .map(|(t, profile, start)| Placed {
            tenant: tenants[t].name.clone(),
            profile: *profile,
            start,
        })
        .collect();
    instances.sort_by_key(|p| p.start);
    Some(Layout {
        gpu: menu.gpu,
        instances,
    })
}

type Choice = (usize, &'static Profile, u8);

struct LayoutSearch<'o> {
    options: &'o [(usize, Vec<&'static Profile>)],
    used: [bool; MEMORY_SLICES as usize],
    compute: u8,
    slices: u8,
    chosen: Vec<Choice>,
    best: Option<((u8, u8), Vec<Choice>)>,
}

impl LayoutSearch<'_> {
    fn dfs(&mut self, k: usize) {
        let Some((t, fitting)) = self.options.get(k) else {
            let score = (self.slices, self.compute);
            if self.best.as_ref().is_none_or(|(best, _)| score < *best) {
                self.best = Some((score, self.chosen.clone()));
            }
            return;
        };
        // What the rest needs at the least: no layout from here beats the best if that reaches it.
        let rest: u8 = self.options[k..].iter().map(|(_, f)| f[0].slices).sum();
        if self
            .best
            .as_ref()
            .is_some_and(|((slices, _), _)| self.slices + rest > *slices)
        {
            return;
        }
        for &profile in fitting {
            if self.compute + profile.compute > COMPUTE_SLICES {
                continue;
            }
            for &start in profile.starts {
                let span = usize::from(start)..usize::from(start + profile.slices);
                if span.end > self.used.len() || self.used[span.clone()].iter().any(|&u| u) {
                    continue;
                }
                self.used[span.clone()].fill(true);
                self.compute += profile.compute;
                self.slices += profile.slices;
                self.chosen.push((*t, profile, start));
                self.dfs(k + 1);
                self.chosen.pop();
                self.slices -= profile.slices;
                self.compute -= profile.compute;
                self.used[span].fill(false);
            }
        }
    }
}

/// The first rule the smallest fitting instances break.
fn why_not(tenants: &[Tenant], options: &[(usize, Vec<&'static Profile>)]) -> NoLayout {
    let smallest = |t: usize| {
        options
            .iter()
            .find(|(x, _)| *x == t)
            .map(|(_, fitting)| fitting[0])
            .expect("every tenant has options")
    };
    if let Some((t, whole)) = (0..tenants.len())
        .map(|t| (t, smallest(t)))
        .find(|(_, p)| p.is_whole())
    {
        let others: Vec<&str> = tenants
            .iter()
            .enumerate()
            .filter(|(o, _)| *o != t)
            .map(|(_, o)| o.name.as_str())
            .collect();
        return NoLayout::WholeGpu {
            tenant: tenants[t].name.clone(),
            needs: tenants[t].memory.gb_text(),
            profile: whole.name,
            others: and_list(&others),
        };
    }
    // What is left: the smallest instances take more memory slices than the GPU has. (Whenever they take
    // eight or fewer, the menus' placements put them side by side; a property test checks it against a brute
    // force over every layout.)
    let list: Vec<String> = tenants
        .iter()
        .enumerate()
        .map(|(t, tenant)| {
            let p = smallest(t);
            format!("{} {} ({})", tenant.name, p.name, p.slices)
        })
        .collect();
    NoLayout::MemorySlices {
        needed: (0..tenants.len()).map(|t| smallest(t).slices).sum(),
        list: list.join(", "),
    }
}

fn and_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

impl fmt::Display for Placed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An instance named by its profile alone ([`layout_of`]) is not said twice.
        if self.tenant != self.profile.name {
            write!(f, "{} on ", self.tenant)?;
        }
        write!(
            f,
            "{} (slices {}–{}, {} GB)",
            self.profile.name,
            self.start,
            self.start + self.profile.slices - 1,
            self.profile.memory().gb_text()
        )
    }
}

#[cfg(test)]
mod tests;
