//! llama.cpp sized to its share as it starts (issue 32). It has no memory-fraction flag, so Tessera reads the
//! model's GGUF header where the engine runs (on this machine, or on its Ray node through a job) and passes the context (`-c`), the slots (`-np`) and, where not every layer fits,
//! the layers on the GPU (`-ngl`) that the estimate says fit the share; the Models tab says what it chose
//! and why. A recipe that sets `-c` itself is left as it is.

use super::model_file::{gguf_info, Files};
use super::spec::{EngineSpec, Sizing};
use crate::catalog::Engine;
use placement::estimate::{cache_type, fit_share, ModelInfo, Settings};
use placement::Bytes;

/// The sizing of `spec`'s engine: a llama.cpp engine on a share, its header read by `files`, where it
/// runs.
pub async fn size(spec: &EngineSpec, files: &dyn Files) -> Sizing {
    let Some(share) = spec
        .share
        .filter(|_| spec.recipe.engine == Engine::LlamaCpp)
    else {
        return Sizing::default();
    };
    // The demo engine stands in where the GPUs are made up; nothing there would read the file.
    if !spec.host.runs_daemons() {
        return Sizing::default();
    }
    if let Some(given) = flag_value(&spec.recipe.args, &["-c", "--ctx-size"]) {
        return Sizing {
            args: Vec::new(),
            note: Some(format!("context {given}, as its recipe sets it (-c)")),
        };
    }
    match gguf_info(files, &spec.recipe.model_path).await {
        Ok(info) => sizing_for(&info, share, &spec.recipe.args),
        Err(why) => Sizing {
            args: Vec::new(),
            note: Some(format!("its context is llama.cpp's own: {why}")),
        },
    }
}

/// The sizing of a model `info` on `share`, under the serving choices its recipe's `args` make (slots,
/// cache types, batches).
pub fn sizing_for(info: &ModelInfo, share: Bytes, args: &[String]) -> Sizing {
    let (base, slots_given) = settings_of(args);
    match fit_share(info, share, &base) {
        Ok(fit) => {
            let mut add = vec!["-c".to_owned(), fit.ctx_size.to_string()];
            if !slots_given {
                add.extend(["-np".to_owned(), fit.slots.to_string()]);
            }
            if let Some(n) = fit.gpu_layers {
                add.extend(["-ngl".to_owned(), n.to_string()]);
            }
            Sizing {
                args: add,
                note: Some(fit.to_string()),
            }
        }
        Err(why) => Sizing {
            args: Vec::new(),
            note: Some(format!("its context is llama.cpp's own: {why}")),
        },
    }
}

/// The serving choices a llama.cpp recipe's arguments make, on llama.cpp server's defaults and one slot,
/// and whether they name the slots.
fn settings_of(args: &[String]) -> (Settings, bool) {
    let number = |flags: &[&str]| flag_value(args, flags).and_then(|v| v.parse::<u32>().ok());
    let mut s = Settings::default();
    let slots = number(&["-np", "--parallel"]).filter(|&n| n > 0);
    if let Some(n) = slots {
        s.slots = n;
    }
    if let Some(t) = flag_value(args, &["-ctk", "--cache-type-k"]).and_then(|v| cache_type(&v)) {
        s.cache_type_k = t;
    }
    if let Some(t) = flag_value(args, &["-ctv", "--cache-type-v"]).and_then(|v| cache_type(&v)) {
        s.cache_type_v = t;
    }
    if let Some(n) = number(&["-b", "--batch-size"]).filter(|&n| n > 0) {
        s.batch = n;
    }
    if let Some(n) = number(&["-ub", "--ubatch-size"]).filter(|&n| n > 0) {
        s.ubatch = n;
    }
    s.unified_kv = has_flag(args, &["-kvu", "--kv-unified"]);
    s.swa_full = has_flag(args, &["--swa-full"]);
    (s, slots.is_some())
}

/// The last value given to any of `flags`, as `flag value` or `flag=value`: the last wins, as in llama.cpp.
pub fn flag_value(args: &[String], flags: &[&str]) -> Option<String> {
    let mut found = None;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if let Some((flag, value)) = word.split_once('=') {
            if flags.contains(&flag) {
                found = Some(value.to_owned());
            }
        } else if flags.contains(&word.as_str()) {
            found = words.next().cloned();
        }
    }
    found
}

fn has_flag(args: &[String], flags: &[&str]) -> bool {
    args.iter().any(|a| flags.contains(&a.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use placement::estimate::writer::{llama, V};
    use placement::estimate::GgufHeader;

    fn info() -> ModelInfo {
        let g = llama(8, 1024, 2816, 16, 4, 32_000, 1).kv("llama.context_length", V::U32(131_072));
        ModelInfo::from_header(&GgufHeader::parse(&g.header()).unwrap(), None)
    }

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn a_llama_cpp_engine_is_started_with_the_longest_context_its_share_holds_and_one_slot() {
        let sizing = sizing_for(&info(), Bytes::gb(1), &[]);
        let c: u32 = sizing.args[1].parse().unwrap();
        assert_eq!(&sizing.args[..1], ["-c"]);
        assert_eq!(&sizing.args[2..], ["-np", "1"]);
        assert!(c > 0 && c < 131_072 && c.is_multiple_of(256), "{c}");
        assert!(sizing.note.unwrap().contains(&format!(
            "context {c} × 1 slot, the longest that fits its 1 GB share"
        )),);
    }

    #[test]
    fn the_recipes_slots_and_cache_type_are_what_the_context_is_sized_under() {
        let plain = sizing_for(&info(), Bytes::gb(1), &[]);
        let four = sizing_for(
            &info(),
            Bytes::gb(1),
            &words("--parallel=4 -ctk q8_0 -ctv q8_0"),
        );
        assert_eq!(
            four.args.len(),
            2,
            "the recipe's own -np stands: {:?}",
            four.args
        );
        let c = |s: &Sizing| s.args[1].parse::<u32>().unwrap();
        // A q8_0 cache is about half of f16's: four slots get about twice one f16 slot's context, together.
        assert!(c(&four) > c(&plain), "{} {}", c(&four), c(&plain));
        assert!(four.note.unwrap().contains("× 4 slots"));
    }

    #[test]
    fn flags_are_read_in_both_spellings_and_the_last_wins() {
        let args = words("-c 100 --ctx-size=200 -np 2");
        assert_eq!(
            flag_value(&args, &["-c", "--ctx-size"]).as_deref(),
            Some("200")
        );
        assert_eq!(
            flag_value(&args, &["-np", "--parallel"]).as_deref(),
            Some("2")
        );
        assert_eq!(flag_value(&args, &["-ngl"]), None);
        assert_eq!(flag_value(&words("-c"), &["-c"]), None);
    }

    #[test]
    fn a_share_that_holds_no_layer_leaves_llama_cpp_its_own_context_and_says_why() {
        let sizing = sizing_for(&info(), Bytes(1 << 20), &[]);
        assert!(sizing.args.is_empty());
        assert_eq!(
            sizing.note.unwrap(),
            "its context is llama.cpp's own: not one of its layers fits its 1 MB share with a context of 512 tokens"
        );
    }
}
