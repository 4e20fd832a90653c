//! Which sharing group a deployed model joins, and the line the wizard states about it (seed 003).

use serde::{Deserialize, Serialize};

/// The group a model deployed with sharing goes into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupChoice {
    /// The group already running on the chosen nodes.
    Join(String),
    /// A new group: named by the model's recipe, or after the model.
    New {
        /// The group's name.
        name: String,
        /// True when no recipe named it and it takes the model's name.
        named_after_model: bool,
    },
}

impl GroupChoice {
    /// The group's name.
    pub fn name(&self) -> &str {
        match self {
            GroupChoice::Join(name) | GroupChoice::New { name, .. } => name,
        }
    }

    /// Whether the deploy starts the group (the router then moves into it and restarts).
    pub fn is_new(&self) -> bool {
        matches!(self, GroupChoice::New { .. })
    }

    /// The wizard's line: `This model joins text-router.` or `Tessera names the group after this model.`
    pub fn line(&self) -> String {
        match self {
            GroupChoice::New {
                named_after_model: true,
                ..
            } => "Tessera names the group after this model.".to_owned(),
            GroupChoice::Join(name) | GroupChoice::New { name, .. } => {
                format!("This model joins {name}.")
            }
        }
    }
}

/// Nodes that cannot take one group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum GroupError {
    /// The chosen nodes run different groups.
    #[error("The chosen nodes run two sharing groups, {0} and {1}; choose nodes of one group.")]
    TwoGroups(String, String),
}

/// The group a model joins: the one running on the chosen nodes; when none runs, the group its recipe names;
/// otherwise a new group named after the model.
pub fn choose_group(
    model: &str,
    recipe_group: Option<&str>,
    groups_on_nodes: &[&str],
) -> Result<GroupChoice, GroupError> {
    let mut running = groups_on_nodes.iter().copied();
    match running.next() {
        Some(first) => match running.find(|g| *g != first) {
            Some(other) => Err(GroupError::TwoGroups(first.to_owned(), other.to_owned())),
            None => Ok(GroupChoice::Join(first.to_owned())),
        },
        None => Ok(match recipe_group {
            Some(name) => GroupChoice::New {
                name: name.to_owned(),
                named_after_model: false,
            },
            None => GroupChoice::New {
                name: model.to_owned(),
                named_after_model: true,
            },
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_joins_the_group_running_on_its_nodes() {
        let choice = choose_group("glm-5.3", None, &["text-router", "text-router"]).unwrap();
        assert_eq!(choice, GroupChoice::Join("text-router".into()));
        assert_eq!(choice.line(), "This model joins text-router.");
        assert!(!choice.is_new());
    }

    #[test]
    fn with_no_group_and_no_recipe_group_the_group_is_named_after_the_model() {
        let choice = choose_group("glm-5.3-shared-with-vision", None, &[]).unwrap();
        assert_eq!(choice.name(), "glm-5.3-shared-with-vision");
        assert_eq!(choice.line(), "Tessera names the group after this model.");
        assert!(choice.is_new());
    }

    #[test]
    fn with_no_group_running_the_recipe_names_it() {
        let choice = choose_group("glm", Some("text-router"), &[]).unwrap();
        assert_eq!(
            choice,
            GroupChoice::New {
                name: "text-router".into(),
                named_after_model: false
            }
        );
        assert_eq!(choice.line(), "This model joins text-router.");
    }

    #[test]
    fn nodes_of_two_groups_are_refused() {
        let err = choose_group("glm", None, &["a", "b"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "The chosen nodes run two sharing groups, a and b; choose nodes of one group."
        );
    }
}
