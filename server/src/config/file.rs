//! The config file: every flag of [`Config`] as a key of a TOML file. Its values become the flags' defaults
//! in clap's own `Command`, so the command line and the environment still win over it, the keys are the
//! flags themselves (no second list to drift), and each value goes through the flag's own parser.

use super::Config;
use clap::{ArgAction, CommandFactory, FromArgMatches};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The file an installed Tessera reads when `--config` is not given, where it exists.
pub const INSTALLED: &str = "/etc/tessera/tessera.toml";

/// Why the settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The command line or the environment: clap's own error, printed and exited as clap does.
    #[error(transparent)]
    Args(#[from] clap::Error),
    /// The file cannot be read.
    #[error("could not read the config file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is not TOML.
    #[error("the config file {} is not valid TOML: {message}", path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// What the TOML parser said, with the line.
        message: String,
    },
    /// A key that is no flag's.
    #[error("unknown key `{key}` in {} (line {line}); {hint}", path.display())]
    UnknownKey {
        /// The file.
        path: PathBuf,
        /// The key as written.
        key: String,
        /// Its line, from 1.
        line: usize,
        /// The key it is close to, or where the keys are listed.
        hint: String,
    },
    /// A value its flag does not take.
    #[error("`{key}` in {} (line {line}): {reason}", path.display())]
    BadValue {
        /// The file.
        path: PathBuf,
        /// The key.
        key: String,
        /// Its line, from 1.
        line: usize,
        /// What the flag takes, or what its parser said.
        reason: String,
    },
}

impl Config {
    /// The settings from this process's command line, its environment and the config file.
    pub fn load() -> Result<Config, LoadError> {
        Config::load_from(std::env::args_os(), Path::new(INSTALLED))
    }

    /// The settings from `args` (the program's name first), the environment, and the config file: the one
    /// `--config` (or `TESSERA_CONFIG`) names, else `installed` where it exists, else none.
    pub fn load_from<I, T>(args: I, installed: &Path) -> Result<Config, LoadError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let mut command = Config::command();
        if let Some(path) = file_named(&command, &args, installed) {
            let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Read {
                path: path.clone(),
                source,
            })?;
            for (id, value) in read(&command, &path, &text)? {
                command = command.mut_arg(id, |arg| arg.default_value(value));
            }
        }
        let mut matches = command.try_get_matches_from(args)?;
        Ok(Config::from_arg_matches_mut(&mut matches)?)
    }
}

/// The file to read: `--config` (or its variable), else `installed` where it exists.
fn file_named(command: &clap::Command, args: &[OsString], installed: &Path) -> Option<PathBuf> {
    // Only --config is wanted here: any other mistake on the command line is the real parse's to report.
    let named = command
        .clone()
        .ignore_errors(true)
        .try_get_matches_from(args)
        .ok()
        .and_then(|matches| matches.get_one::<PathBuf>("config").cloned());
    named.or_else(|| installed.exists().then(|| installed.to_path_buf()))
}

/// The flags a file may set, by key: each of the server's own flags, its long name with `_` for `-`.
fn keys(command: &clap::Command) -> Vec<(String, &clap::Arg)> {
    command
        .get_arguments()
        .filter(|arg| {
            !matches!(arg.get_action(), ArgAction::Help | ArgAction::Version)
                && arg.get_id() != "config"
        })
        .filter_map(|arg| Some((arg.get_long()?.replace('-', "_"), arg)))
        .collect()
}

/// The file's values, each as its flag's id and the text the flag would be given, in the file's order.
fn read(
    command: &clap::Command,
    path: &Path,
    text: &str,
) -> Result<Vec<(String, String)>, LoadError> {
    let syntax = |e: toml::de::Error| LoadError::Syntax {
        path: path.to_owned(),
        message: e.to_string().trim_end().to_owned(),
    };
    // The values from the plain table; the lines from the parser's spans, for the messages.
    let values: toml::Table = text.parse().map_err(syntax)?;
    let spans = toml::de::DeTable::parse(text).map_err(syntax)?;
    let mut lines: Vec<(usize, &str)> = spans
        .get_ref()
        .keys()
        .map(|key| (line_of(text, key.span().start), key.get_ref().as_ref()))
        .collect();
    lines.sort_unstable();
    let keys = keys(command);
    let mut out = Vec::new();
    for (line, key) in lines {
        let Some((_, arg)) = keys.iter().find(|(known, _)| known == key) else {
            return Err(LoadError::UnknownKey {
                path: path.to_owned(),
                key: key.to_owned(),
                line,
                hint: hint(key, &keys),
            });
        };
        let bad = |reason: String| LoadError::BadValue {
            path: path.to_owned(),
            key: key.to_owned(),
            line,
            reason,
        };
        let value = flag_text(arg, &values[key]).map_err(bad)?;
        check(arg, &value).map_err(bad)?;
        out.push((arg.get_id().to_string(), value));
    }
    Ok(out)
}

/// The line (from 1) that byte `at` of `text` is on.
fn line_of(text: &str, at: usize) -> usize {
    text[..at].matches('\n').count() + 1
}

/// The known key an unknown one is close to, as clap suggests a flag.
fn hint(key: &str, keys: &[(String, &clap::Arg)]) -> String {
    let written = key.replace('-', "_");
    keys.iter()
        .map(|(known, _)| (strsim::jaro(&written, known), known))
        .filter(|(score, _)| *score > 0.7)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map_or_else(
            || {
                "the keys are the flags' long names with _ for - (tessera --help lists them)"
                    .to_owned()
            },
            |(_, known)| format!("did you mean `{known}`?"),
        )
}

/// `value` as its flag would be written on the command line: a switch takes true or false, any other flag
/// one value (a string, or a number written as TOML writes it).
fn flag_text(arg: &clap::Arg, value: &toml::Value) -> Result<String, String> {
    let switch = matches!(arg.get_action(), ArgAction::SetTrue);
    match value {
        toml::Value::Boolean(on) if switch => Ok(on.to_string()),
        other if switch => Err(format!("takes true or false, not {other}")),
        toml::Value::String(text) => Ok(text.clone()),
        toml::Value::Integer(n) => Ok(n.to_string()),
        toml::Value::Float(x) => Ok(x.to_string()),
        toml::Value::Boolean(_) => Err(format!(
            "takes a value, such as --{} does, not true or false",
            arg.get_long().unwrap_or_default()
        )),
        other => Err(format!(
            "takes one value, such as --{} does, not a TOML {}",
            arg.get_long().unwrap_or_default(),
            other.type_str()
        )),
    }
}

/// Runs `value` through the flag's own parser (alone, without its variable), so that a bad value is
/// named with the file's key rather than found later as a bad default.
fn check(arg: &clap::Arg, value: &str) -> Result<(), String> {
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        return Ok(());
    }
    let long = arg.get_long().unwrap_or_default();
    clap::Command::new("tessera")
        .no_binary_name(true)
        .arg(arg.clone().env(None))
        .try_get_matches_from([format!("--{long}={value}")])
        .map(drop)
        .map_err(|e| {
            let said = e.to_string();
            let first = said.lines().next().unwrap_or_default();
            first.strip_prefix("error: ").unwrap_or(first).to_owned()
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Command, UserCommand};

    /// `text` as a config file in a folder of its own.
    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tessera.toml");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    /// The settings from `args` after `tessera --config PATH`, with no installed file.
    fn load(path: &Path, args: &[&str]) -> Result<Config, LoadError> {
        let mut all: Vec<OsString> = vec!["tessera".into(), "--config".into(), path.into()];
        all.extend(args.iter().map(OsString::from));
        Config::load_from(all, Path::new("/nonexistent/tessera.toml"))
    }

    #[test]
    fn a_file_value_is_used_where_no_flag_says_otherwise() {
        let (_dir, path) = file(
            "listen = \"0.0.0.0:3100\"\ndata_dir = \"/var/lib/tessera\"\ndemo = true\n\
             keep_audit_days = 30\ninterference_threshold = 2.5\n",
        );
        let config = load(&path, &[]).unwrap();
        assert_eq!(config.listen, "0.0.0.0:3100".parse().unwrap());
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/tessera"));
        assert!(config.demo);
        assert_eq!(config.retention.keep_audit_days, 30);
        assert_eq!(config.interference_threshold.to_string(), "2.50×");
        assert_eq!(config.config, Some(path));
        // What the file leaves out keeps its default.
        assert_eq!(config.gateway_wait_s, 30);
    }

    #[test]
    fn a_flag_wins_over_the_file() {
        let (_dir, path) = file("data_dir = \"/var/lib/tessera\"\nmax_restarts = 2\n");
        let config = load(&path, &["--data-dir", "/tmp/other", "--max-restarts", "9"]).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/tmp/other"));
        assert_eq!(config.engines.max_restarts, 9);
    }

    #[test]
    fn the_subcommands_take_the_file_s_settings() {
        let (_dir, path) = file("data_dir = \"/var/lib/tessera\"\n");
        let config = load(&path, &["user", "add", "ada", "--role", "admin"]).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/tessera"));
        assert!(matches!(
            config.command,
            Some(Command::User { action: UserCommand::Add { ref name, .. } }) if name == "ada"
        ));
    }

    #[test]
    fn an_unknown_key_is_refused_with_its_line_and_the_key_it_is_close_to() {
        let (_dir, path) = file("# a comment\ndemo = true\nlistn = \"0.0.0.0:3000\"\n");
        let err = load(&path, &[]).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "unknown key `listn` in {} (line 3); did you mean `listen`?",
                path.display()
            )
        );
        let (_dir, path) = file("data-dir = \"/srv\"\n");
        let err = load(&path, &[]).unwrap_err().to_string();
        assert!(err.ends_with("did you mean `data_dir`?"), "{err}");
        let (_dir, path) = file("[engines]\nmax_restarts = 2\n");
        let err = load(&path, &[]).unwrap_err().to_string();
        assert!(err.starts_with("unknown key `engines`"), "{err}");
        let (_dir, path) = file("colour = \"blue\"\n");
        let err = load(&path, &[]).unwrap_err().to_string();
        assert!(
            err.ends_with(
                "the keys are the flags' long names with _ for - (tessera --help lists them)"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_value_of_the_wrong_type_is_refused_naming_its_key_and_what_it_takes() {
        let cases = [
            ("demo = \"yes\"", "`demo` in {} (line 1): takes true or false, not \"yes\""),
            (
                "gateway_wait_s = \"soon\"",
                "`gateway_wait_s` in {} (line 1): invalid value 'soon' for '--gateway-wait-s <S>': invalid digit found in string",
            ),
            (
                "listen = 3000",
                "`listen` in {} (line 1): invalid value '3000' for '--listen <LISTEN>': invalid socket address syntax",
            ),
            (
                "latency_window_s = 0",
                "`latency_window_s` in {} (line 1): invalid value '0' for '--latency-window-s <S>': 0 is not in 1..=3600",
            ),
            (
                "inventory = [\"a.toml\"]",
                "`inventory` in {} (line 1): takes one value, such as --inventory does, not a TOML array",
            ),
            (
                "https = 1",
                "`https` in {} (line 1): takes true or false, not 1",
            ),
        ];
        for (text, expected) in cases {
            let (_dir, path) = file(text);
            let err = load(&path, &[]).unwrap_err().to_string();
            assert_eq!(err, expected.replace("{}", &path.display().to_string()));
        }
    }

    #[test]
    fn a_file_that_is_not_toml_or_not_there_is_refused_naming_it() {
        let (_dir, path) = file("listen = \n");
        let err = load(&path, &[]).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "the config file {} is not valid TOML",
                path.display()
            )),
            "{err}"
        );
        assert!(err.contains("line 1"), "{err}");
        let missing = Path::new("/nonexistent/elsewhere.toml");
        let err = load(missing, &[]).unwrap_err().to_string();
        assert!(
            err.starts_with("could not read the config file /nonexistent/elsewhere.toml:"),
            "{err}"
        );
    }

    #[test]
    fn the_installed_file_is_read_without_config_and_none_is_needed() {
        let (_dir, path) = file("data_dir = \"/var/lib/tessera\"\n");
        let config = Config::load_from(["tessera"], &path).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("/var/lib/tessera"));
        let config =
            Config::load_from(["tessera"], Path::new("/nonexistent/tessera.toml")).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("data"));
        assert_eq!(config.config, None);
    }

    /// deploy/tessera.toml: each key once, commented out, at its default where the flag has one; all of
    /// them together, uncommented, a file the server takes.
    #[test]
    fn the_sample_file_names_every_key_at_its_default() {
        let sample = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/tessera.toml"),
        )
        .unwrap();
        let settings: String = sample
            .lines()
            .filter_map(|line| line.strip_prefix("# "))
            .filter(|line| line.contains(" = "))
            .map(|line| format!("{line}\n"))
            .collect();
        let table: toml::Table = settings.parse().unwrap();
        let command = Config::command();
        let keys = keys(&command);
        let mut named: Vec<&String> = table.keys().collect();
        let mut known: Vec<&String> = keys.iter().map(|(key, _)| key).collect();
        named.sort();
        known.sort();
        assert_eq!(named, known, "deploy/tessera.toml's keys");
        for (key, arg) in &keys {
            if let [default] = arg.get_default_values() {
                let written = flag_text(arg, &table[key.as_str()]).unwrap();
                assert_eq!(
                    written,
                    default.to_str().unwrap(),
                    "{key} in deploy/tessera.toml"
                );
            }
        }
        let (_dir, path) = file(&settings);
        load(&path, &[]).expect("the sample's values, uncommented");
    }
}
