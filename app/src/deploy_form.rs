//! The Deploy a model wizard's reasoning, apart from any component so that it can be tested plainly: which
//! group the model joins on the chosen nodes, which GPUs it runs on, the plan the Shared GPU memory panel
//! opens on, and who restarts. The rules themselves are `placement`'s.

use crate::share_form::ShareRow;
use crate::views::{CatalogEntry, DeployOptions, EstimateQuery, GroupPlan, NodeOption};
use placement::{
    choose_group, pick_new_group_gpus, running, transition, BasisPoints, Candidate, Demand, GpuRef,
    GroupChoice, GroupGpu, PlanMember,
};

/// Step one of the wizard as filled in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placement {
    /// The catalog model.
    pub model: String,
    /// The chosen nodes, in the order the wizard lists them.
    pub nodes: Vec<String>,
    /// How many GPUs the model takes on each node.
    pub width: u32,
    /// The group picked to join, where the chosen nodes run several.
    pub group: Option<String>,
}

/// A deploy with sharing, worked out from step one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedDeploy {
    /// The group it joins or starts, and the wizard's line about it.
    pub choice: GroupChoice,
    /// The revision of the group it joins.
    pub revision: Option<i64>,
    /// The GPUs the plan is judged against, with the shared work outside the group on each.
    pub gpus: Vec<GroupGpu>,
    /// The plan the panel opens on: the group's members (the router locked), then the new model.
    pub members: Vec<PlanMember>,
    /// The group's committed plan (empty for a new group).
    pub before: Vec<PlanMember>,
    /// Its on-demand members not loaded now.
    pub unloaded: Vec<String>,
    /// Members that run in another group now and move into this new one (the router).
    pub moving_in: Vec<String>,
}

impl SharedDeploy {
    /// The panel's rows.
    pub fn rows(&self) -> Vec<ShareRow> {
        self.members.iter().map(ShareRow::from_member).collect()
    }

    /// Who restarts, stops or starts if the rows are deployed, in plan order (`placement::transition`).
    pub fn restarts(&self, plan: &[PlanMember]) -> Vec<String> {
        let (before, after) = running(&self.before, &self.unloaded, plan);
        let moving: Vec<&str> = self.moving_in.iter().map(String::as_str).collect();
        transition(&before, &after, &moving)
            .restarts
            .into_iter()
            .map(|r| r.member)
            .collect()
    }

    /// The other members' shares that the rows change, as the server wants them.
    pub fn changed_shares(&self, plan: &[PlanMember]) -> Vec<(String, BasisPoints)> {
        plan.iter()
            .filter_map(|m| {
                let before = self.before.iter().find(|b| b.name == m.name)?;
                let share = m.share?;
                (Some(share) != before.share).then(|| (m.name.clone(), share))
            })
            .collect()
    }

    /// The other members whose demand the rows change, as the server wants them.
    pub fn changed_demand(&self, plan: &[PlanMember]) -> Vec<(String, Demand)> {
        let others: Vec<PlanMember> = plan
            .iter()
            .filter(|m| self.before.iter().any(|b| b.name == m.name))
            .cloned()
            .collect();
        crate::share_form::changed_demand(&self.before, &others)
    }
}

/// The nodes the wizard may offer: those with a GPU that shared work can use (`shared`), or with a free GPU.
pub fn selectable(node: &NodeOption, shared: bool) -> bool {
    node.gpus
        .iter()
        .any(|g| g.healthy && if shared { !g.held_whole } else { g.is_free() })
}

/// How many nodes the wizard's list shows at once: a fleet of a thousand machines is searched, not
/// scrolled.
pub const NODES_SHOWN: usize = 50;

/// The nodes the wizard's list shows, in the fleet's order: every chosen one (so that it can be unchosen
/// wherever it is), and the first [`NODES_SHOWN`] whose name holds `query` (any case); with how many
/// match in all.
pub fn shown_nodes<'a>(
    nodes: &'a [NodeOption],
    query: &str,
    chosen: &[String],
) -> (Vec<&'a NodeOption>, usize) {
    let query = query.trim().to_lowercase();
    let mut matching = 0;
    let shown = nodes
        .iter()
        .filter(|n| {
            let matches = n.name.to_lowercase().contains(&query);
            matching += usize::from(matches);
            chosen.contains(&n.name) || matches && matching <= NODES_SHOWN
        })
        .collect();
    (shown, matching)
}

fn node<'a>(options: &'a DeployOptions, name: &str) -> Result<&'a NodeOption, String> {
    options
        .nodes
        .iter()
        .find(|n| n.name == name)
        .ok_or_else(|| format!("There is no node named {name}."))
}

fn check_placement(placement: &Placement) -> Result<(), String> {
    if placement.model.is_empty() {
        return Err("Choose a model.".to_owned());
    }
    if placement.nodes.is_empty() {
        return Err("Choose at least one node.".to_owned());
    }
    if placement.width == 0 {
        return Err("Choose a GPU width of at least 1.".to_owned());
    }
    Ok(())
}

fn entry<'a>(options: &'a DeployOptions, model: &str) -> Result<&'a CatalogEntry, String> {
    options
        .catalog
        .iter()
        .find(|m| m.name == model)
        .ok_or_else(|| format!("The catalog has no model named {model}."))
}

/// The sharing groups running on the chosen nodes, with a line each (`text-router · GPU 0 of h200-node ·
/// glm-5.3, vision`), where there are several to pick from: the model joins one.
pub fn groups_on_nodes(options: &DeployOptions, nodes: &[String]) -> Vec<(String, String)> {
    let groups: Vec<(String, String)> = options
        .groups
        .iter()
        .filter(|g| g.gpus.iter().any(|gpu| nodes.contains(&gpu.machine)))
        .map(|g| {
            let gpus: Vec<String> = g.gpus.iter().map(ToString::to_string).collect();
            let members: Vec<&str> = g.members.iter().map(|m| m.name.as_str()).collect();
            (
                g.name.clone(),
                format!("{} · {} · {}", g.name, gpus.join(", "), members.join(", ")),
            )
        })
        .collect();
    if groups.len() > 1 {
        groups
    } else {
        Vec::new()
    }
}

/// The deploy with sharing that step one describes, or what to change in step one.
pub fn shared_deploy(
    options: &DeployOptions,
    placement: &Placement,
) -> Result<SharedDeploy, String> {
    check_placement(placement)?;
    let model = entry(options, &placement.model)?;
    let on_nodes: Vec<&GroupPlan> = options
        .groups
        .iter()
        .filter(|g| {
            g.gpus
                .iter()
                .any(|gpu| placement.nodes.contains(&gpu.machine))
        })
        .collect();
    let mut names: Vec<&str> = on_nodes.iter().map(|g| g.name.as_str()).collect();
    // Of several groups on the nodes, the one picked (the wizard lists them: groups_on_nodes).
    if let Some(picked) = placement.group.as_deref().filter(|g| names.contains(g)) {
        names = vec![picked];
    }
    let choice =
        choose_group(&model.name, model.group.as_deref(), &names).map_err(|e| match e {
            placement::GroupError::TwoGroups(..) => format!(
                "The chosen nodes run {} sharing groups: choose the one {} joins.",
                names.len(),
                model.name
            ),
            e => e.to_string(),
        })?;
    let new_member = PlanMember {
        locked: model.system,
        ..PlanMember::new(&model.name, model.default_share)
    };
    match &choice {
        GroupChoice::Join(name) => {
            let group = on_nodes
                .iter()
                .find(|g| &g.name == name)
                .expect("the group chosen runs on the nodes");
            let gpus = group
                .gpus
                .iter()
                .map(|gpu| group_gpu(options, gpu, Some(&group.name)))
                .collect::<Result<Vec<_>, _>>()?;
            let mut members = group.members.clone();
            members.push(new_member);
            Ok(SharedDeploy {
                revision: Some(group.revision),
                gpus,
                before: group.members.clone(),
                unloaded: group.unloaded.clone(),
                members,
                moving_in: Vec::new(),
                choice,
            })
        }
        GroupChoice::New { name, .. } => {
            if let Some(elsewhere) = options.groups.iter().find(|g| &g.name == name) {
                let nodes: Vec<&str> = elsewhere.gpus.iter().map(|g| g.machine.as_str()).collect();
                return Err(format!(
                    "The recipe of {} names the group {name}, which runs on {}: choose that node to join it.",
                    model.name,
                    nodes.join(", ")
                ));
            }
            let mut gpus = Vec::new();
            for name in &placement.nodes {
                let node = node(options, name)?;
                gpus.extend(pick_shared(node, placement.width, model.default_share)?);
            }
            if gpus.windows(2).any(|w| w[0].total != w[1].total) {
                return Err(
                    "A group's shares are of one GPU's memory: choose nodes whose GPUs are of one size."
                        .to_owned(),
                );
            }
            // The router leaves the group it runs in, with its share, and restarts in the new one.
            let router = options
                .groups
                .iter()
                .find_map(|g| g.members.iter().find(|m| m.locked));
            let mut members: Vec<PlanMember> = router.cloned().into_iter().collect();
            members.push(new_member);
            Ok(SharedDeploy {
                revision: None,
                gpus,
                moving_in: router.map(|r| r.name.clone()).into_iter().collect(),
                members,
                before: Vec::new(),
                unloaded: Vec::new(),
                choice,
            })
        }
    }
}

fn group_gpu(
    options: &DeployOptions,
    gpu: &GpuRef,
    group: Option<&str>,
) -> Result<GroupGpu, String> {
    node(options, &gpu.machine)?
        .gpus
        .iter()
        .find(|g| g.index == gpu.index)
        .map(|g| g.for_group(&gpu.machine, group))
        .ok_or_else(|| format!("{gpu} is no longer in the inventory."))
}

/// `width` GPUs of `node` for a new group, by `placement`'s best fit for `share`.
fn pick_shared(node: &NodeOption, width: u32, share: BasisPoints) -> Result<Vec<GroupGpu>, String> {
    let candidates: Vec<Candidate> = node
        .gpus
        .iter()
        .map(|g| Candidate {
            gpu: g.for_group(&node.name, None),
            healthy: g.healthy,
            held_whole: g.held_whole,
        })
        .collect();
    pick_new_group_gpus(&candidates, width, share)
        .map_err(|usable| too_few(node, width, usable, "shared work can use"))
}

fn too_few(node: &NodeOption, width: u32, have: usize, what: &str) -> String {
    let gpus = if have == 1 { "GPU" } else { "GPUs" };
    format!(
        "{} has {have} {gpus} that {what}, fewer than a GPU width of {width}: choose a smaller width or another node.",
        node.name
    )
}

/// The GPUs a deploy without sharing takes whole: the first `width` free, healthy GPUs of each chosen node.
pub fn whole_gpus(options: &DeployOptions, placement: &Placement) -> Result<Vec<GpuRef>, String> {
    check_placement(placement)?;
    entry(options, &placement.model)?;
    let mut out = Vec::new();
    for name in &placement.nodes {
        let node = node(options, name)?;
        let free: Vec<GpuRef> = node
            .gpus
            .iter()
            .filter(|g| g.healthy && g.is_free())
            .map(|g| GpuRef::new(&node.name, g.index))
            .collect();
        if free.len() < placement.width as usize {
            return Err(too_few(node, placement.width, free.len(), "are free"));
        }
        out.extend(free.into_iter().take(placement.width as usize));
    }
    Ok(out)
}

/// Environment variables as the form's text area holds them, one `NAME=value` per line.
pub fn parse_env(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!(
                "Line {}: write each variable as NAME=value, such as VLLM_LOGGING_LEVEL=INFO.",
                n + 1
            ));
        };
        let name = name.trim();
        if !placement::names::is_env_name(name) {
            return Err(format!(
                "Line {}: {name:?} is not a variable name; {}.",
                n + 1,
                placement::names::ENV_NAME_RULE
            ));
        }
        if out.iter().any(|(k, _)| k == name) {
            return Err(format!("Line {}: {name} is set twice.", n + 1));
        }
        out.push((name.to_owned(), value.trim().to_owned()));
    }
    Ok(out)
}

/// Extra arguments as the form's field holds them, split as a shell would (no shell runs them).
pub fn parse_args(text: &str) -> Result<Vec<String>, String> {
    shlex::split(text).ok_or_else(|| {
        "The extra arguments have an unclosed quote; close it, or write the argument without quotes."
            .to_owned()
    })
}

/// The extra arguments as the form's field shows them, quoted where a shell would need it.
pub fn args_text(args: &[String]) -> String {
    shlex::try_join(args.iter().map(String::as_str)).unwrap_or_else(|_| args.join(" "))
}

/// The environment as the form's text area shows it.
pub fn env_text(env: &[(String, String)]) -> String {
    env.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// An example of extra arguments for `engine`, in its own flags (a vLLM flag means nothing to llama.cpp).
/// None for a `command` recipe: its command line is its recipe's.
pub fn args_example(engine: &str) -> Option<&'static str> {
    match engine {
        "vllm" => Some("--max-model-len 8192"),
        "sglang" => Some("--context-length 8192"),
        "llamacpp" => Some("--ctx-size 8192"),
        _ => None,
    }
}

/// The estimate's inputs as typed: context empty for the model's own, slots from 1.
pub fn estimate_query(
    model: &str,
    machine: Option<String>,
    context: &str,
    slots: &str,
    cache_type: &str,
) -> Result<EstimateQuery, String> {
    let context = match context.trim() {
        "" => None,
        text => Some(text.parse::<u32>().map_err(|_| {
            "The context is a whole number of tokens, such as 8192, or empty for the model's own."
                .to_owned()
        })?),
    };
    let slots = slots
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| (1..=placement::estimate::MAX_SLOTS).contains(n))
        .ok_or_else(|| {
            format!(
                "Parallel slots is a whole number from 1 to {}.",
                placement::estimate::MAX_SLOTS
            )
        })?;
    Ok(EstimateQuery {
        model: model.to_owned(),
        machine,
        context,
        slots,
        cache_type: cache_type.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{GpuOption, Sharer};
    use placement::Bytes;

    #[test]
    fn the_example_arguments_are_the_engine_s_own_flags() {
        assert_eq!(args_example("vllm"), Some("--max-model-len 8192"));
        assert_eq!(args_example("sglang"), Some("--context-length 8192"));
        assert_eq!(args_example("llamacpp"), Some("--ctx-size 8192"));
        assert_eq!(args_example("command"), None);
    }

    fn gpu(index: u32, gb: u64) -> GpuOption {
        GpuOption {
            index,
            model: "NVIDIA RTX PRO 6000".into(),
            total: Bytes::gb(gb),
            held_outside: Bytes::ZERO,
            healthy: true,
            held_whole: false,
            sharers: Vec::new(),
        }
    }

    fn entry(name: &str, pct: u32, group: Option<&str>, system: bool) -> CatalogEntry {
        CatalogEntry {
            name: name.into(),
            engine: "vllm".into(),
            default_share: BasisPoints::percent(pct),
            group: group.map(Into::into),
            system,
            deployed: false,
        }
    }

    #[test]
    fn the_node_list_shows_the_chosen_nodes_and_the_first_fifty_that_match_in_the_fleet_s_order() {
        let nodes: Vec<NodeOption> = (0..1250)
            .map(|m| NodeOption {
                name: format!("gpu-{m:04}"),
                gpus: vec![gpu(0, 80)],
            })
            .collect();
        let names = |shown: Vec<&NodeOption>| -> Vec<String> {
            shown.into_iter().map(|n| n.name.clone()).collect()
        };
        let (shown, matching) = shown_nodes(&nodes, "", &[]);
        assert_eq!(matching, 1250);
        assert_eq!(names(shown), names(nodes[..NODES_SHOWN].iter().collect()));

        let chosen = vec!["gpu-1200".to_owned(), "gpu-0003".to_owned()];
        let (shown, matching) = shown_nodes(&nodes, " GPU-07 ", &chosen);
        assert_eq!(matching, 100);
        let shown = names(shown);
        assert_eq!(shown.len(), NODES_SHOWN + 2);
        assert_eq!(shown[0], "gpu-0003");
        assert_eq!(shown[1], "gpu-0700");
        assert_eq!(shown[NODES_SHOWN], "gpu-0749");
        assert_eq!(shown[NODES_SHOWN + 1], "gpu-1200");

        let (shown, matching) = shown_nodes(&nodes, "nothing-like-it", &chosen);
        assert_eq!(
            (names(shown), matching),
            (chosen.iter().rev().cloned().collect(), 0)
        );
    }

    /// atlas (2 × 96 GB) runs text-router on GPU 0 with the router at 10 % and glm-5.3 at 40 %; h200-node
    /// is free, but for a worker holding GPU 0 whole and a 2 GB sharer on GPU 1.
    fn options() -> DeployOptions {
        let mut atlas0 = gpu(0, 96);
        atlas0.sharers = vec![
            Sharer {
                name: "semantic-router".into(),
                group: Some("text-router".into()),
                bytes: Bytes::gb(96).share(BasisPoints::percent(10)),
            },
            Sharer {
                name: "glm-5.3".into(),
                group: Some("text-router".into()),
                bytes: Bytes::gb(96).share(BasisPoints::percent(40)),
            },
        ];
        let mut h0 = gpu(0, 141);
        h0.held_whole = true;
        let mut h1 = gpu(1, 141);
        h1.sharers = vec![Sharer {
            name: "listen".into(),
            group: None,
            bytes: Bytes::gb(2),
        }];
        DeployOptions {
            catalog: vec![
                entry("semantic-router", 10, Some("text-router"), true),
                entry("glm-5.3", 40, Some("text-router"), false),
                entry("vision", 25, None, false),
                entry("qwen", 30, Some("text-router"), false),
            ],
            nodes: vec![
                NodeOption {
                    name: "atlas".into(),
                    gpus: vec![atlas0, gpu(1, 96)],
                },
                NodeOption {
                    name: "h200-node".into(),
                    gpus: vec![h0, h1, gpu(2, 141)],
                },
            ],
            groups: vec![GroupPlan {
                name: "text-router".into(),
                revision: 4,
                gpus: vec![GpuRef::new("atlas", 0)],
                members: vec![
                    PlanMember {
                        locked: true,
                        ..PlanMember::new("semantic-router", BasisPoints::percent(10))
                    },
                    PlanMember::new("glm-5.3", BasisPoints::percent(40)),
                ],
                unloaded: Vec::new(),
            }],
        }
    }

    fn placement(model: &str, nodes: &[&str], width: u32) -> Placement {
        Placement {
            model: model.into(),
            nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
            width,
            group: None,
        }
    }

    #[test]
    fn on_a_node_of_two_groups_the_model_joins_the_one_picked() {
        let mut options = options();
        // A second group on atlas's other GPU.
        options.groups.push(GroupPlan {
            name: "speech-pool".into(),
            revision: 2,
            gpus: vec![GpuRef::new("atlas", 1)],
            members: vec![PlanMember::new("speech", BasisPoints::percent(30))],
            unloaded: Vec::new(),
        });
        let mut asked = placement("vision", &["atlas"], 1);
        assert_eq!(
            shared_deploy(&options, &asked).unwrap_err(),
            "The chosen nodes run 2 sharing groups: choose the one vision joins."
        );
        let listed = groups_on_nodes(&options, &asked.nodes);
        assert_eq!(
            listed,
            [
                (
                    "text-router".to_owned(),
                    "text-router · GPU 0 of atlas · semantic-router, glm-5.3".to_owned()
                ),
                (
                    "speech-pool".to_owned(),
                    "speech-pool · GPU 1 of atlas · speech".to_owned()
                ),
            ]
        );
        asked.group = Some("speech-pool".into());
        let deploy = shared_deploy(&options, &asked).unwrap();
        assert_eq!(deploy.choice.line(), "This model joins speech-pool.");
        assert_eq!(deploy.revision, Some(2));
        assert_eq!(
            deploy
                .gpus
                .iter()
                .map(|g| g.gpu.clone())
                .collect::<Vec<_>>(),
            [GpuRef::new("atlas", 1)]
        );
        // One group on the chosen nodes: nothing to pick.
        assert!(groups_on_nodes(&options, &["h200-node".to_owned()]).is_empty());
    }

    #[test]
    fn a_model_on_a_node_of_a_group_joins_it_with_the_group_s_plan() {
        let deploy = shared_deploy(&options(), &placement("vision", &["atlas"], 1)).unwrap();
        assert_eq!(deploy.choice.line(), "This model joins text-router.");
        assert_eq!(deploy.revision, Some(4));
        let texts: Vec<_> = deploy
            .rows()
            .into_iter()
            .map(|r| (r.name, r.text, r.locked))
            .collect();
        assert_eq!(
            texts,
            [
                ("semantic-router".to_owned(), "10".to_owned(), true),
                ("glm-5.3".to_owned(), "40".to_owned(), false),
                ("vision".to_owned(), "25".to_owned(), false),
            ]
        );
        // The group's own memory does not count against it.
        assert_eq!(deploy.gpus[0].taken_by_others, Bytes::ZERO);
        assert_eq!(deploy.restarts(&deploy.members), ["vision"]);
    }

    #[test]
    fn lowering_another_member_restarts_it_and_is_sent_as_a_change() {
        let deploy = shared_deploy(&options(), &placement("vision", &["atlas"], 1)).unwrap();
        let mut plan = deploy.members.clone();
        plan[1].share = Some(BasisPoints::percent(30));
        assert_eq!(deploy.restarts(&plan), ["glm-5.3", "vision"]);
        assert_eq!(
            deploy.changed_shares(&plan),
            [("glm-5.3".to_owned(), BasisPoints::percent(30))]
        );
    }

    #[test]
    fn a_new_group_is_named_after_the_model_and_the_router_moves_into_it() {
        let deploy = shared_deploy(&options(), &placement("vision", &["h200-node"], 1)).unwrap();
        assert_eq!(
            deploy.choice.line(),
            "Tessera names the group after this model."
        );
        assert_eq!(deploy.revision, None);
        // GPU 0 is held whole; GPU 1, already shared, is the best fit and leaves GPU 2 whole.
        assert_eq!(deploy.gpus[0].gpu, GpuRef::new("h200-node", 1));
        assert_eq!(deploy.gpus[0].taken_by_others, Bytes::gb(2));
        let names: Vec<_> = deploy
            .members
            .iter()
            .map(|m| (m.name.as_str(), m.locked))
            .collect();
        assert_eq!(names, [("semantic-router", true), ("vision", false)]);
        assert_eq!(
            deploy.restarts(&deploy.members),
            ["semantic-router", "vision"]
        );
    }

    #[test]
    fn a_recipe_group_running_elsewhere_sends_the_operator_to_its_node() {
        let err = shared_deploy(&options(), &placement("qwen", &["h200-node"], 1)).unwrap_err();
        assert_eq!(
            err,
            "The recipe of qwen names the group text-router, which runs on atlas: choose that node to join it."
        );
    }

    #[test]
    fn too_wide_a_placement_says_what_the_node_has() {
        let err = shared_deploy(&options(), &placement("vision", &["h200-node"], 3)).unwrap_err();
        assert_eq!(
            err,
            "h200-node has 2 GPUs that shared work can use, fewer than a GPU width of 3: choose a smaller width or another node."
        );
        assert_eq!(
            whole_gpus(&options(), &placement("vision", &["h200-node"], 1)).unwrap(),
            [GpuRef::new("h200-node", 2)]
        );
        assert!(whole_gpus(&options(), &placement("vision", &["h200-node"], 2)).is_err());
    }

    #[test]
    fn a_node_whose_gpus_are_all_in_use_is_offered_only_with_sharing() {
        let options = options();
        let mut atlas = options.nodes[0].clone();
        atlas.gpus.truncate(1);
        assert!(selectable(&atlas, true));
        assert!(!selectable(&atlas, false));
    }

    #[test]
    fn environment_lines_are_read_as_name_and_value() {
        assert_eq!(
            parse_env("A=1\n\n B = x=y \n").unwrap(),
            [
                ("A".to_owned(), "1".to_owned()),
                ("B".to_owned(), "x=y".to_owned())
            ]
        );
        assert_eq!(
            parse_env("1A=2").unwrap_err(),
            "Line 1: \"1A\" is not a variable name; use letters, digits and '_', not starting with a digit."
        );
        assert!(parse_env("A=1\nA=2").is_err());
        assert!(parse_env("novalue").is_err());
        let args = parse_args("--max-model-len 8192 --served-model-name 'glm 5'").unwrap();
        assert_eq!(
            args,
            ["--max-model-len", "8192", "--served-model-name", "glm 5"]
        );
        assert_eq!(
            args_text(&args),
            "--max-model-len 8192 --served-model-name 'glm 5'"
        );
        assert!(parse_args("--name 'open").is_err());
    }

    #[test]
    fn the_estimates_inputs_are_read_as_typed() {
        let q = estimate_query("m", None, "", "2", "q8_0").unwrap();
        assert_eq!((q.context, q.slots), (None, 2));
        assert_eq!(
            estimate_query("m", None, " 8192 ", "1", "f16")
                .unwrap()
                .context,
            Some(8192)
        );
        assert!(estimate_query("m", None, "lots", "1", "f16").is_err());
        assert!(estimate_query("m", None, "", "0", "f16").is_err());
    }
}
