//! One colour per model on every page: a name's colour comes from the name alone, not from its row's
//! position, so a model reads the same in the share panel, a machine's memory bars and the sharing form.
//! Eleven colours (`--s0` … `--s10` in the stylesheet); none is red, which marks what is over. Two models
//! may share a colour (a name's hash decides it); the legend under each bar and the share table name them.

/// How many colours there are.
pub const COLOURS: u32 = 11;

/// The CSS class of `name`'s colour: `s0` … `s10`.
pub fn of(name: &str) -> String {
    // FNV-1a: the same on the server and in the browser, whatever the platform's hasher.
    let hash = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("s{}", hash % COLOURS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_has_one_colour_whatever_its_place_and_the_colours_spread() {
        assert_eq!(of("glm-5.3"), of("glm-5.3"));
        let names = [
            "glm-5.3",
            "vision",
            "speech",
            "semantic-router",
            "reranker",
            "embed",
            "listen",
            "voice",
        ];
        let distinct: std::collections::BTreeSet<String> = names.iter().map(|n| of(n)).collect();
        assert!(distinct.len() >= 5, "{distinct:?}");
        assert!(names.iter().all(|n| of(n).starts_with('s')));
        // The demo fleet's text-router members read apart.
        let demo: std::collections::BTreeSet<String> =
            ["glm-5.3", "semantic-router", "vision", "speech"]
                .iter()
                .map(|n| of(n))
                .collect();
        assert_eq!(demo.len(), 4);
    }
}
