//! Names typed by people that the browser checks as they are typed and the server checks again: written
//! once, here.

/// Whether `name` is an environment variable name as a shell and the engines take it: letters, digits and
/// `_`, not starting with a digit.
pub fn is_env_name(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// How to write an environment variable name, for a message that refuses one.
pub const ENV_NAME_RULE: &str = "use letters, digits and '_', not starting with a digit";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_variable_name_is_letters_digits_and_underscores_not_starting_with_a_digit() {
        for good in ["HF_HOME", "_X", "a1"] {
            assert!(is_env_name(good), "{good}");
        }
        for bad in ["", "1BAD", "A-B", "A B", "É"] {
            assert!(!is_env_name(bad), "{bad}");
        }
    }
}
