//! Which engines are clients of which MPS daemon: a daemon starts before its GPU's first client and is
//! stopped after its last, on this machine as on a cluster's node.

use placement::sharing::MpsDaemon;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::OwnedMutexGuard;

/// The daemons that have clients, by pipe directory (one per GPU), each with its clients' units.
#[derive(Default)]
pub(crate) struct MpsClients(BTreeMap<String, (MpsDaemon, BTreeSet<String>)>);

impl MpsClients {
    /// `unit` is a client of `daemon` from now on.
    pub(crate) fn join(&mut self, daemon: MpsDaemon, unit: &str) {
        self.0
            .entry(daemon.pipe_dir.clone())
            .or_insert_with(|| (daemon, BTreeSet::new()))
            .1
            .insert(unit.to_owned());
    }

    /// The pipe directory of the daemon `unit` is a client of, if it is one.
    pub(crate) fn daemon_of(&self, unit: &str) -> Option<String> {
        self.0
            .iter()
            .find_map(|(dir, (_, clients))| clients.contains(unit).then(|| dir.clone()))
    }

    /// `unit` is no client from now on: the daemon it leaves without clients, which is to stop, if any.
    pub(crate) fn leave(&mut self, unit: &str) -> Option<MpsDaemon> {
        let pipe_dir = self
            .0
            .iter_mut()
            .find_map(|(dir, (_, clients))| clients.remove(unit).then(|| dir.clone()))?;
        if self.0[&pipe_dir].1.is_empty() {
            self.0.remove(&pipe_dir).map(|(daemon, _)| daemon)
        } else {
            None
        }
    }
}

/// One lock per daemon (by pipe directory), held across its control program's calls: a daemon's start,
/// its clients' joins and its stop come one at a time, while other GPUs' daemons start meanwhile.
#[derive(Default)]
pub(crate) struct DaemonLocks(Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl DaemonLocks {
    /// Waits for the daemon of `pipe_dir` to be free, and holds it until the guard is dropped.
    pub(crate) async fn lock(&self, pipe_dir: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            locks.entry(pipe_dir.to_owned()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_is_left_to_stop_by_its_last_client_only() {
        let daemon = |index| MpsDaemon::new("/data", "atlas", index, "GPU-1");
        let mut clients = MpsClients::default();
        clients.join(daemon(0), "a");
        clients.join(daemon(0), "b");
        clients.join(daemon(1), "c");
        assert_eq!(clients.leave("a"), None);
        assert_eq!(clients.leave("nobody"), None);
        assert_eq!(clients.leave("b"), Some(daemon(0)));
        assert_eq!(clients.leave("b"), None);
        assert_eq!(clients.leave("c"), Some(daemon(1)));
    }
}
