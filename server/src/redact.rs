//! Secrets (tokens, keys, passwords) in an engine's environment or arguments: how they are recognised and
//! blotted out. Below the fleet and the audit log, which both redact, so that neither imports the other.

use std::collections::BTreeMap;

/// What a secret's value is shown as to everyone but admins, and written as in the audit log. A form that
/// sends it back unchanged keeps the stored value.
pub const REDACTED: &str = "(secret)";

/// Parts of a name that mark a secret.
const SECRET_MARKS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "API_KEY",
    "APIKEY",
    "ACCESS_KEY",
    "PRIVATE_KEY",
    "CREDENTIAL",
];

/// Whether the variable (or argument) `name` holds a secret: by its name, or because the recipe says so.
pub fn is_secret(name: &str, marked: &[String]) -> bool {
    let upper = name
        .trim_start_matches('-')
        .to_ascii_uppercase()
        .replace('-', "_");
    marked.iter().any(|m| m == name)
        || upper.ends_with("_KEY")
        || SECRET_MARKS.iter().any(|mark| upper.contains(mark))
}

/// `env` with every secret's value replaced by [`REDACTED`].
pub fn redact_env(env: &BTreeMap<String, String>, marked: &[String]) -> BTreeMap<String, String> {
    env.iter()
        .map(|(name, value)| {
            let value = if is_secret(name, marked) {
                REDACTED.to_owned()
            } else {
                value.clone()
            };
            (name.clone(), value)
        })
        .collect()
}

/// `args` with the value of every secret flag (`--api-key X`, `--api-key=X`) replaced by [`REDACTED`].
pub fn redact_args(args: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(args.len());
    let mut next_is_secret = false;
    for arg in args {
        if next_is_secret {
            out.push(REDACTED.to_owned());
            next_is_secret = false;
            continue;
        }
        match arg.split_once('=') {
            Some((flag, _)) if flag.starts_with('-') && is_secret(flag, &[]) => {
                out.push(format!("{flag}={REDACTED}"));
            }
            _ => {
                next_is_secret = arg.starts_with("--") && is_secret(arg, &[]);
                out.push(arg.clone());
            }
        }
    }
    out
}

/// The secret values in `env` and `args`, to be blotted out of an engine's output for non-admins.
pub fn secret_values(
    env: &BTreeMap<String, String>,
    args: &[String],
    marked: &[String],
) -> Vec<String> {
    let mut values: Vec<String> = env
        .iter()
        .filter(|(name, _)| is_secret(name, marked))
        .map(|(_, value)| value.clone())
        .collect();
    for (arg, shown) in args.iter().zip(redact_args(args)) {
        if *arg != shown {
            values.push(match arg.split_once('=') {
                Some((_, value)) => value.to_owned(),
                None => arg.clone(),
            });
        }
    }
    // A value of a character or two would blot out half of every line.
    values.retain(|v| v.len() >= 4);
    values
}

/// `line` with every secret value in it replaced by [`REDACTED`].
pub fn redact_line(line: &str, secrets: &[String]) -> String {
    secrets.iter().fold(line.to_owned(), |line, secret| {
        line.replace(secret.as_str(), REDACTED)
    })
}

/// `value` (an audit entry's before or after) with the secrets of every `env` object and `args` array in
/// it redacted: the audit log never holds a secret.
pub fn redact_json(mut value: serde_json::Value, marked: &[String]) -> serde_json::Value {
    fn walk(value: &mut serde_json::Value, marked: &[String]) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    match (key.as_str(), &mut *inner) {
                        ("env", serde_json::Value::Object(env)) => {
                            for (name, v) in env.iter_mut() {
                                if is_secret(name, marked) {
                                    *v = REDACTED.into();
                                }
                            }
                        }
                        ("args", serde_json::Value::Array(args)) => {
                            let strings: Option<Vec<String>> =
                                args.iter().map(|a| a.as_str().map(str::to_owned)).collect();
                            if let Some(strings) = strings {
                                *args = redact_args(&strings).into_iter().map(Into::into).collect();
                            }
                        }
                        _ => walk(inner, marked),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(|i| walk(i, marked)),
            _ => {}
        }
    }
    walk(&mut value, marked);
    value
}

/// A form sent back with [`REDACTED`] where it showed a secret keeps the stored value.
pub fn keep_secrets(env: &mut BTreeMap<String, String>, stored: &BTreeMap<String, String>) {
    for (name, value) in env.iter_mut() {
        if value == REDACTED {
            if let Some(kept) = stored.get(name) {
                value.clone_from(kept);
            }
        }
    }
}
