//! Failed sign-ins, counted per account name and per address. Past a few failures within the window, each
//! further try must wait, twice as long each time. Unknown names are counted like known ones, so the
//! throttle says nothing about which names exist.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a failure counts.
pub const WINDOW: Duration = Duration::from_secs(15 * 60);
/// The first wait, once the failures reach the limit.
const FIRST_WAIT: Duration = Duration::from_secs(30);

/// What is counted: the account name typed, or the address it came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Key {
    /// Failures for one account name (as typed).
    Account(String),
    /// Failures from one address.
    Address(String),
}

impl Key {
    /// The failures allowed within the window before tries must wait.
    fn limit(&self) -> usize {
        match self {
            Key::Account(_) => 5,
            // Many people may share an address (a NAT): more room there.
            Key::Address(_) => 20,
        }
    }
}

/// The throttle.
#[derive(Debug, Default)]
pub struct Throttle {
    failures: Mutex<HashMap<Key, Vec<Instant>>>,
}

impl Throttle {
    /// How long a try under `keys` must still wait at `now`, if it must.
    pub fn wait(&self, keys: &[Key], now: Instant) -> Option<Duration> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        keys.iter()
            .filter_map(|key| {
                let times = failures.get_mut(key)?;
                times.retain(|t| now.duration_since(*t) < WINDOW);
                let over = times.len().checked_sub(key.limit())?;
                let wait = FIRST_WAIT.saturating_mul(1 << over.min(10)).min(WINDOW);
                let until = *times.last()? + wait;
                (until > now).then(|| until - now)
            })
            .max()
    }

    /// Counts a failure under each of `keys`.
    pub fn fail(&self, keys: &[Key], now: Instant) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            let times = failures.entry(key.clone()).or_default();
            times.retain(|t| now.duration_since(*t) < WINDOW);
            times.push(now);
        }
        // Forget keys whose failures have all aged out, so that the map does not grow without bound.
        failures.retain(|_, times| {
            times
                .last()
                .is_some_and(|t| now.duration_since(*t) < WINDOW)
        });
    }

    /// A sign-in succeeded: the account's failures are forgotten (the address's are not).
    pub fn succeed(&self, account: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(&Key::Account(account.to_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(account: &str, address: &str) -> Vec<Key> {
        vec![
            Key::Account(account.to_owned()),
            Key::Address(address.to_owned()),
        ]
    }

    #[test]
    fn an_account_waits_after_five_failures_and_twice_as_long_after_each_more() {
        let throttle = Throttle::default();
        let start = Instant::now();
        let k = keys("ada", "10.0.0.1");
        for i in 0..4 {
            throttle.fail(&k, start + Duration::from_secs(i));
            assert_eq!(throttle.wait(&k, start + Duration::from_secs(i)), None);
        }
        let fifth = start + Duration::from_secs(4);
        throttle.fail(&k, fifth);
        assert_eq!(throttle.wait(&k, fifth), Some(Duration::from_secs(30)));
        assert_eq!(throttle.wait(&k, fifth + Duration::from_secs(31)), None);
        let sixth = fifth + Duration::from_secs(31);
        throttle.fail(&k, sixth);
        assert_eq!(throttle.wait(&k, sixth), Some(Duration::from_secs(60)));
        // Another address trying the same account waits too.
        assert!(throttle.wait(&keys("ada", "10.9.9.9"), sixth).is_some());
        // The failures age out.
        assert_eq!(throttle.wait(&k, sixth + WINDOW), None);
    }

    #[test]
    fn an_address_trying_many_names_waits_and_a_success_clears_only_the_account() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for i in 0..20 {
            throttle.fail(&keys(&format!("name{i}"), "10.0.0.2"), now);
        }
        assert!(throttle
            .wait(&keys("someone-else", "10.0.0.2"), now)
            .is_some());
        assert_eq!(throttle.wait(&keys("someone-else", "10.0.0.3"), now), None);
        throttle.succeed("name1");
        assert!(
            throttle.wait(&keys("name1", "10.0.0.2"), now).is_some(),
            "the address still waits"
        );
    }
}
