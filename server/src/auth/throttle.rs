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

/// A try, counted as a failure from the moment it is let through until it succeeds. Counting it before
/// the password is checked (which takes argon2 tens of milliseconds) is what keeps a burst of tries sent
/// at once within the limit: each one sees the tries before it.
#[derive(Debug)]
pub struct Reservation {
    keys: Vec<Key>,
    at: Instant,
}

impl Throttle {
    /// Lets a try under `keys` through at `now`, counted as a failure until [`Throttle::succeed`]; or says
    /// how long it must still wait.
    pub fn reserve(&self, keys: &[Key], now: Instant) -> Result<Reservation, Duration> {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let wait = keys
            .iter()
            .filter_map(|key| {
                let times = failures.get_mut(key)?;
                times.retain(|t| now.duration_since(*t) < WINDOW);
                let over = times.len().checked_sub(key.limit())?;
                let wait = FIRST_WAIT.saturating_mul(1 << over.min(10)).min(WINDOW);
                let until = *times.last()? + wait;
                (until > now).then(|| until - now)
            })
            .max();
        if let Some(wait) = wait {
            return Err(wait);
        }
        for key in keys {
            failures.entry(key.clone()).or_default().push(now);
        }
        // Forget keys whose failures have all aged out, so that the map does not grow without bound.
        failures.retain(|_, times| {
            times
                .last()
                .is_some_and(|t| now.duration_since(*t) < WINDOW)
        });
        Ok(Reservation {
            keys: keys.to_vec(),
            at: now,
        })
    }

    /// The try succeeded: the account's failures are forgotten, and the address's count loses this try
    /// (but keeps the failures before it).
    pub fn succeed(&self, reservation: Reservation) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        for key in &reservation.keys {
            match key {
                Key::Account(_) => {
                    failures.remove(key);
                }
                Key::Address(_) => {
                    if let Some(times) = failures.get_mut(key) {
                        if let Some(i) = times.iter().rposition(|t| *t == reservation.at) {
                            times.remove(i);
                        }
                    }
                }
            }
        }
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
        for i in 0..5 {
            assert!(throttle.reserve(&k, start + Duration::from_secs(i)).is_ok());
        }
        let fifth = start + Duration::from_secs(4);
        assert_eq!(
            throttle.reserve(&k, fifth).unwrap_err(),
            Duration::from_secs(30)
        );
        let sixth = fifth + Duration::from_secs(31);
        assert!(throttle.reserve(&k, sixth).is_ok());
        assert_eq!(
            throttle.reserve(&k, sixth).unwrap_err(),
            Duration::from_secs(60)
        );
        // Another address trying the same account waits too.
        assert!(throttle.reserve(&keys("ada", "10.9.9.9"), sixth).is_err());
        // The failures age out.
        assert!(throttle.reserve(&k, sixth + WINDOW).is_ok());
    }

    #[test]
    fn an_address_trying_many_names_waits_and_a_success_clears_only_the_account() {
        let throttle = Throttle::default();
        let now = Instant::now();
        for i in 0..20 {
            assert!(throttle
                .reserve(&keys(&format!("name{i}"), "10.0.0.2"), now)
                .is_ok());
        }
        assert!(throttle
            .reserve(&keys("someone-else", "10.0.0.2"), now)
            .is_err());
        assert!(throttle
            .reserve(&keys("someone-else", "10.0.0.3"), now)
            .is_ok());
        let ada = keys("ada", "10.0.0.4");
        for _ in 0..4 {
            throttle.reserve(&ada, now).unwrap();
        }
        let fifth = throttle.reserve(&ada, now).unwrap();
        throttle.succeed(fifth);
        assert!(
            throttle.reserve(&keys("ada", "10.0.0.5"), now).is_ok(),
            "the account's failures are forgotten"
        );
        assert!(
            throttle.reserve(&keys("name1", "10.0.0.2"), now).is_err(),
            "the address still waits"
        );
    }

    #[test]
    fn tries_made_at_once_are_counted_before_any_is_checked() {
        let throttle = std::sync::Arc::new(Throttle::default());
        let now = Instant::now();
        let passed: usize = std::thread::scope(|scope| {
            let tries: Vec<_> = (0..40)
                .map(|_| {
                    let throttle = throttle.clone();
                    scope.spawn(move || throttle.reserve(&keys("ada", "10.0.0.6"), now).is_ok())
                })
                .collect();
            tries
                .into_iter()
                .map(|t| usize::from(t.join().unwrap()))
                .sum()
        });
        assert_eq!(passed, 5, "the account's limit, and not one try more");
    }
}
