//! An engine that sizes itself by what is free on its GPUs as it loads (SGLang's `--mem-fraction-static`,
//! a fraction of what it finds free once its imports are done, 10 to 60 s into its start, and its KV cache
//! what is free after its weights less the rest of that) takes whatever a neighbour frees meanwhile: a
//! neighbour stopped while it loads hands it up to twice its share. So the two exclude each other on a
//! GPU: such an engine starts (its free memory read for its fraction) only once no engine there is
//! stopping, and an engine there stops only once no such engine is loading. Each waits at most a bound,
//! then goes on and says so: a hung load or stop must not hold the other for ever.

use placement::GpuRef;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;

#[derive(Default)]
struct Held {
    /// Units loading by what is free, and their GPUs.
    reading: BTreeMap<String, Vec<GpuRef>>,
    /// Units stopping, and their GPUs.
    freeing: BTreeMap<String, Vec<GpuRef>>,
}

impl Held {
    fn beside<'a>(
        of: &'a BTreeMap<String, Vec<GpuRef>>,
        unit: &'a str,
        gpus: &'a [GpuRef],
    ) -> impl Iterator<Item = &'a str> {
        of.iter()
            .filter(move |(other, theirs)| {
                other.as_str() != unit && theirs.iter().any(|g| gpus.contains(g))
            })
            .map(|(other, _)| other.as_str())
    }
}

/// Which side a unit takes on its GPUs.
#[derive(Clone, Copy)]
enum Side {
    Reading,
    Freeing,
}

#[derive(Default)]
pub(super) struct FreeReaders {
    held: Mutex<Held>,
    changed: Notify,
}

/// A unit's place on one side, until dropped.
pub(super) struct Turn {
    readers: Arc<FreeReaders>,
    unit: String,
    side: Side,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut held = self.readers.lock();
        match self.side {
            Side::Reading => held.reading.remove(&self.unit),
            Side::Freeing => held.freeing.remove(&self.unit),
        };
        drop(held);
        self.readers.changed.notify_waiters();
    }
}

impl FreeReaders {
    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `unit` reads what is free on `gpus` to size itself, until the turn is dropped (once its KV cache
    /// is allocated): first, no engine there is stopping, or `within` has passed.
    pub(super) async fn read(
        self: &Arc<Self>,
        unit: &str,
        gpus: Vec<GpuRef>,
        within: Duration,
    ) -> Turn {
        self.take(unit, gpus, within, Side::Reading).await
    }

    /// `unit` frees its memory on `gpus`, until the turn is dropped (once it has stopped): first, no
    /// engine there is loading by what is free, or `within` has passed.
    pub(super) async fn free(
        self: &Arc<Self>,
        unit: &str,
        gpus: Vec<GpuRef>,
        within: Duration,
    ) -> Turn {
        self.take(unit, gpus, within, Side::Freeing).await
    }

    async fn take(
        self: &Arc<Self>,
        unit: &str,
        gpus: Vec<GpuRef>,
        within: Duration,
        side: Side,
    ) -> Turn {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            // Enabled before the check: a turn dropped between the check and the wait is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut held = self.lock();
                let others = match side {
                    Side::Reading => &held.freeing,
                    Side::Freeing => &held.reading,
                };
                let waited_on: Vec<String> = Held::beside(others, unit, &gpus)
                    .map(str::to_owned)
                    .collect();
                let over = tokio::time::Instant::now() >= deadline;
                if waited_on.is_empty() || over {
                    if over {
                        tracing::warn!(
                            "{unit} goes on after {within:?} waiting for {}: {}",
                            waited_on.join(", "),
                            match side {
                                Side::Reading => "its SGLang start may take what they free",
                                Side::Freeing =>
                                    "an SGLang engine loading beside it may take what it frees",
                            }
                        );
                    }
                    match side {
                        Side::Reading => held.reading.insert(unit.to_owned(), gpus),
                        Side::Freeing => held.freeing.insert(unit.to_owned(), gpus),
                    };
                    return Turn {
                        readers: self.clone(),
                        unit: unit.to_owned(),
                        side,
                    };
                }
            }
            let _ = tokio::time::timeout_at(deadline, changed).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpus(names: &[&str]) -> Vec<GpuRef> {
        names.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[tokio::test]
    async fn an_engine_that_reads_what_is_free_starts_once_its_neighbour_has_stopped_and_a_neighbour_stops_once_it_has_loaded(
    ) {
        let readers = Arc::new(FreeReaders::default());
        let long = Duration::from_secs(60);
        let stopping = readers.free("speech", gpus(&["atlas:1"]), long).await;
        // Another GPU is not held.
        drop(readers.read("emb", gpus(&["atlas:0"]), long).await);
        let waiting = {
            let readers = readers.clone();
            tokio::spawn(async move { readers.read("vision", gpus(&["atlas:1"]), long).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "vision waits for speech's stop");
        drop(stopping);
        let loading = waiting.await.unwrap();

        let stop = {
            let readers = readers.clone();
            tokio::spawn(async move { readers.free("glm", gpus(&["atlas:1"]), long).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!stop.is_finished(), "glm's stop waits for vision's load");
        // Its own stop is no neighbour's.
        drop(readers.free("vision", gpus(&["atlas:1"]), long).await);
        drop(loading);
        drop(stop.await.unwrap());
    }

    #[tokio::test]
    async fn a_wait_past_its_bound_goes_on() {
        let readers = Arc::new(FreeReaders::default());
        let _loading = readers
            .read("vision", gpus(&["atlas:1"]), Duration::ZERO)
            .await;
        let started = std::time::Instant::now();
        drop(
            readers
                .free("glm", gpus(&["atlas:1"]), Duration::from_millis(100))
                .await,
        );
        assert!(started.elapsed() >= Duration::from_millis(100));
    }
}
