//! The committed sharing groups and catalog models, by name: persistent maps, as the workers are, so that
//! a write's copy of the committed state costs nothing and its change the log of their number, and a
//! model's group is found without a walk through every group (2,000 at fleet size, once per deploy and
//! per gateway request for a model loaded on demand).

use super::Group;
use crate::catalog::CatalogModel;
use std::sync::Arc;

/// The sharing groups, in name order, with the group of each member model.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Groups {
    by_name: imbl::OrdMap<String, Arc<Group>>,
    /// (member model, group): a model is a member of one group, and of the first by name where the
    /// database ever held it in more.
    members: imbl::OrdSet<(String, String)>,
}

impl Groups {
    /// Every group, in name order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &Arc<Group>> {
        self.by_name.values()
    }

    /// The group `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Group> {
        self.by_name.get(name).map(Arc::as_ref)
    }

    /// The group `model` is a member of.
    pub(crate) fn of_member(&self, model: &str) -> Option<&Group> {
        let (member, group) = self
            .members
            .range((model.to_owned(), String::new())..)
            .next()?;
        (member == model).then(|| self.get(group)).flatten()
    }

    /// Puts `group` in, in the place of one of its name.
    pub(crate) fn put(&mut self, group: Arc<Group>) {
        self.remove(&group.name);
        for member in &group.members {
            self.members
                .insert((member.member.clone(), group.name.clone()));
        }
        self.by_name.insert(group.name.clone(), group);
    }

    /// Takes the group `name` out.
    pub(crate) fn remove(&mut self, name: &str) {
        if let Some(group) = self.by_name.remove(name) {
            for member in &group.members {
                self.members
                    .remove(&(member.member.clone(), group.name.clone()));
            }
        }
    }
}

impl FromIterator<Arc<Group>> for Groups {
    fn from_iter<I: IntoIterator<Item = Arc<Group>>>(groups: I) -> Groups {
        let mut all = Groups::default();
        for group in groups {
            all.put(group);
        }
        all
    }
}

impl<'a> IntoIterator for &'a Groups {
    type Item = &'a Arc<Group>;
    type IntoIter =
        imbl::ordmap::Values<'a, String, Arc<Group>, imbl::shared_ptr::DefaultSharedPtr>;
    fn into_iter(self) -> Self::IntoIter {
        self.by_name.values()
    }
}

/// The model catalog, in name order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Models(imbl::OrdMap<String, Arc<CatalogModel>>);

impl Models {
    /// Every model, in name order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &CatalogModel> {
        self.0.values().map(Arc::as_ref)
    }

    /// The model `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&CatalogModel> {
        self.0.get(name).map(Arc::as_ref)
    }

    /// Puts `model` in, in the place of one of its name.
    pub(crate) fn put(&mut self, model: CatalogModel) {
        self.0.insert(model.name.clone(), Arc::new(model));
    }

    /// Takes the model `name` out.
    pub(crate) fn remove(&mut self, name: &str) {
        self.0.remove(name);
    }
}

impl FromIterator<CatalogModel> for Models {
    fn from_iter<I: IntoIterator<Item = CatalogModel>>(models: I) -> Models {
        Models(
            models
                .into_iter()
                .map(|m| (m.name.clone(), Arc::new(m)))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use placement::{BasisPoints, Share};

    fn group(name: &str, members: &[&str]) -> Arc<Group> {
        Arc::new(Group {
            name: name.to_owned(),
            gpus: Vec::new(),
            revision: 1,
            members: members
                .iter()
                .map(|&m| Share::new(m, BasisPoints::percent(5)))
                .collect(),
            serving: Default::default(),
            demand: Default::default(),
            loaded: Default::default(),
            autoscale: Default::default(),
            placed: Default::default(),
            asleep: Default::default(),
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, ..Default::default() })]
        /// Each step puts a group (of some of four models) in, or takes one out; after each, a model's
        /// group, a group by name and the groups in order are what a walk through a list kept in name
        /// order finds.
        #[test]
        fn a_model_s_group_is_the_first_by_name_a_walk_through_every_group_finds(
            steps in proptest::collection::vec((0..4usize, proptest::collection::btree_set(0..4usize, 0..3), proptest::bool::ANY), 1..30),
        ) {
            let models = ["glm", "qwen", "whisper", "bge"];
            let mut groups = Groups::default();
            let mut list: Vec<Arc<Group>> = Vec::new();
            for (g, members, put) in steps {
                let name = format!("g{g}");
                list.retain(|x| x.name != name);
                if put {
                    let members: Vec<&str> = members.iter().map(|&m| models[m]).collect();
                    let new = group(&name, &members);
                    list.push(new.clone());
                    list.sort_by(|a, b| a.name.cmp(&b.name));
                    groups.put(new);
                } else {
                    groups.remove(&name);
                }
                for model in models {
                    let walked = list.iter().find(|x| x.members.iter().any(|s| s.member == model));
                    proptest::prop_assert_eq!(groups.of_member(model).map(|x| &x.name), walked.map(|x| &x.name));
                }
                for g in 0..4 {
                    let name = format!("g{g}");
                    proptest::prop_assert_eq!(groups.get(&name), list.iter().find(|x| x.name == name).map(|x| x.as_ref()));
                }
                proptest::prop_assert!(groups.iter().eq(list.iter()));
            }
        }
    }
}
