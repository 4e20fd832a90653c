//! llama.cpp sized to its share as it starts (issue 32), and never started unbounded on one (issue 42).
//! It has no memory-fraction flag, so Tessera reads the model's GGUF header where the engine runs (on this
//! machine, or on its Ray node through a job) and passes the context (`-c`), the slots (`-np`) and, where
//! not every layer fits, the layers on the GPU (`-ngl`) that the estimate says fit the share; the Models
//! tab says what it chose and why. A recipe's own `-c` and `-np` are judged against the share by the same
//! estimate. Where the estimate has a gap (a Mamba's compute buffers) or the file cannot be read, a
//! cautious context bounds it; where even that, or the recipe's own, is over the share, the engine is not
//! started and the reason is shown. Without `-c`, llama.cpp takes the model's whole trained context, or in
//! recent builds fits itself to what is free on the GPU: on a shared GPU, the neighbours' room. SGLang's
//! KV cache is bounded in tokens too ([`sglang_sizing`]).

use super::model_file::{estimate_folder, gguf_info, Files};
use super::spec::{EngineSpec, Sizing};
use crate::catalog::Engine;
use placement::estimate::hf::HfSettings;
use placement::estimate::{
    cache_tokens_within, cache_type, cautious, fit_share, judge, Estimate, Judged, ModelInfo,
    Settings, Unfit, CAUTIOUS_CONTEXT,
};
use placement::Bytes;

/// Why an engine is not started on its share.
#[derive(Debug, thiserror::Error)]
pub enum Unsized {
    /// The recipe's `-c` is not a number llama.cpp reads as one.
    #[error("not started: its -c is {0:?}, not a number of tokens")]
    NotANumber(String),
    /// The recipe's own context and slots take more than the share.
    #[error(
        "not started: as its recipe sets it, {0}: lower its -c or -np, or give it a larger share"
    )]
    GivenOver(Judged),
    /// Even the cautious context takes more than the share, by what the estimate knows.
    #[error(
        "not started: the estimate is incomplete, and even a cautious {0} ({gap}): give it a larger \
         share",
        gap = .0.gap.as_deref().unwrap_or("a part is not estimated")
    )]
    CautiousOver(Judged),
    /// Not one layer fits with the shortest context.
    #[error("not started: {0}")]
    NoRoom(Unfit),
    /// The recipe asks for the model's own context (`-c 0`) of a file that could not be read.
    #[error(
        "not started: its recipe asks for the model's own context (-c 0), which cannot be judged \
         against its share: {0}"
    )]
    OwnUnjudged(String),
}

/// The sizing of `spec`'s engine on a share (llama.cpp's, SGLang's), its model read by `files`, where it
/// runs.
pub async fn size(spec: &EngineSpec, files: &dyn Files) -> Result<Sizing, Unsized> {
    let Some(share) = spec.share else {
        return Ok(Sizing::default());
    };
    // The demo engine stands in where the GPUs are made up; nothing there would read the file.
    if !spec.host.runs_daemons() {
        return Ok(Sizing::default());
    }
    // The estimate is the whole model's: an engine on several GPUs (tensor parallel, or llama.cpp's
    // split) holds its share on each.
    let share = Bytes(share.get().saturating_mul(spec.gpus.len().max(1) as u64));
    let path = &spec.recipe.model_path;
    match spec.recipe.engine {
        Engine::LlamaCpp => {
            let info = gguf_info(files, path).await.map_err(|why| why.to_string());
            sizing_for(
                info.as_ref().map_err(String::as_str),
                share,
                &spec.recipe.args,
            )
        }
        Engine::Sglang => {
            let estimate = estimate_folder(files, path, &HfSettings::default())
                .await
                .map_err(|why| why.to_string());
            Ok(sglang_sizing(
                estimate.as_ref().map_err(String::as_str),
                share,
            ))
        }
        Engine::Vllm | Engine::Command => Ok(Sizing::default()),
    }
}

/// SGLang's KV cache bounded in tokens (`--max-total-tokens`, which SGLang takes as a ceiling on what its
/// `--mem-fraction-static` sizes). The fraction is of what SGLang finds free 10 to 60 s after it starts,
/// once its imports are done: a neighbour stopped meanwhile, or one holding less than its share, would
/// hand it up to twice its share. The tokens are what the share leaves after the weights and buffers, by
/// the estimate, whatever is free then.
pub fn sglang_sizing(estimate: Result<&Estimate, &str>, share: Bytes) -> Sizing {
    // SGLang's own buffers are not measured here (no GPU was lent to measure them), and the estimate counts
    // a whole batch of logits: where it leaves no room for a cache, the fraction alone bounds the engine,
    // and the note says why, rather than refusing a start SGLang might make.
    let fraction_alone = |why: &dyn std::fmt::Display| Sizing {
        args: Vec::new(),
        note: Some(format!(
            "bounded by --mem-fraction-static alone, of what is free as it starts: {why}"
        )),
    };
    let e = match estimate {
        Ok(e) => e,
        Err(why) => return fraction_alone(&why),
    };
    match cache_tokens_within(e, share) {
        Ok(Some(tokens)) => Sizing {
            args: vec!["--max-total-tokens".to_owned(), tokens.to_string()],
            note: Some(format!(
                "at most {tokens} tokens of KV cache: what its {} share leaves after its weights and \
                 buffers ({}), whatever is free as it starts",
                share.size_text(),
                e.beside_cache().size_text()
            )),
        },
        Ok(None) => Sizing::default(),
        Err(no_room) => fraction_alone(&no_room),
    }
}

/// The sizing of a model (its header's `info`, or why it could not be read) on `share`, under the
/// serving choices its recipe's `args` make (context, slots, cache types, batches).
pub fn sizing_for(
    info: Result<&ModelInfo, &str>,
    share: Bytes,
    args: &[String],
) -> Result<Sizing, Unsized> {
    let (mut base, slots_given) = settings_of(args);
    // Tessera's arguments come before the recipe's, and llama.cpp takes the last: the recipe's own -np
    // stands, and one is added where it says none (recent builds default to several slots).
    let slots = |n: u32| -> Vec<String> {
        if slots_given {
            Vec::new()
        } else {
            vec!["-np".to_owned(), n.to_string()]
        }
    };
    if let Some(given) = flag_value(args, &["-c", "--ctx-size"]) {
        let ctx_size: u32 = given
            .trim()
            .parse()
            .map_err(|_| Unsized::NotANumber(given.clone()))?;
        return match info {
            Ok(info) => {
                // -c 0 is the model's own context, shared by the slots.
                let total = match ctx_size {
                    0 => info.context_length.unwrap_or(CAUTIOUS_CONTEXT),
                    n => n,
                };
                base.context = Some((total / base.slots).max(1));
                let judged = judge(info, share, &base).map_err(|e| match e {
                    Unfit::Over(judged) => Unsized::GivenOver(judged),
                    other => Unsized::NoRoom(other),
                })?;
                Ok(Sizing {
                    args: slots(base.slots),
                    note: Some(format!("as its recipe sets it, {judged}")),
                })
            }
            Err(why) if ctx_size > 0 => Ok(Sizing {
                args: slots(base.slots),
                note: Some(format!(
                    "context {ctx_size}, as its recipe sets it, not judged against its share: {why}"
                )),
            }),
            Err(why) => Err(Unsized::OwnUnjudged(why.to_owned())),
        };
    }
    let bounded = |ctx_size: u32, n: u32, note: String| {
        let mut args = vec!["-c".to_owned(), ctx_size.to_string()];
        args.extend(slots(n));
        Sizing {
            args,
            note: Some(note),
        }
    };
    let info = match info {
        Ok(info) => info,
        // Nothing to judge by: the cautious bound, as the file was not read.
        Err(why) => {
            return Ok(bounded(
                CAUTIOUS_CONTEXT,
                base.slots,
                format!(
                    "-c {CAUTIOUS_CONTEXT} -np {}, a cautious bound not judged against its share: {why}",
                    base.slots
                ),
            ))
        }
    };
    match fit_share(info, share, &base) {
        Ok(fit) => {
            let mut sizing = bounded(fit.ctx_size, fit.slots, fit.to_string());
            if let Some(n) = fit.gpu_layers {
                sizing.args.extend(["-ngl".to_owned(), n.to_string()]);
            }
            Ok(sizing)
        }
        Err(Unfit::Incomplete(gap)) => {
            let judged = cautious(info, share, &base).map_err(|e| match e {
                Unfit::Over(judged) => Unsized::CautiousOver(judged),
                other => Unsized::NoRoom(other),
            })?;
            Ok(bounded(
                judged.ctx_size,
                judged.slots,
                format!("a cautious bound, as the estimate is incomplete ({gap}): {judged}"),
            ))
        }
        Err(other) => Err(Unsized::NoRoom(other)),
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

/// The last value given to any of `flags`, as `flag value` or `flag=value` (Python's parsers take both;
/// llama.cpp refuses the second and does not start): the last wins, as in each engine. A long flag is read
/// with `_` for `-`, as llama.cpp and Python's parsers read it, so that `--ctx_size 0` is the context it is.
pub fn flag_value(args: &[String], flags: &[&str]) -> Option<String> {
    let mut found = None;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        if let Some((flag, value)) = word.split_once('=') {
            if flags.contains(&spelled(flag).as_ref()) {
                found = Some(value.to_owned());
            }
        } else if flags.contains(&spelled(word).as_ref()) {
            found = words.next().cloned();
        }
    }
    found
}

fn has_flag(args: &[String], flags: &[&str]) -> bool {
    args.iter().any(|a| flags.contains(&spelled(a).as_ref()))
}

/// `word` as the engines' parsers compare it: a long flag with `_` for `-`.
fn spelled(word: &str) -> std::borrow::Cow<'_, str> {
    if word.starts_with("--") && word.contains('_') {
        word.replace('_', "-").into()
    } else {
        word.into()
    }
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
        let sizing = sizing_for(Ok(&info()), Bytes::gb(1), &[]).unwrap();
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
        let plain = sizing_for(Ok(&info()), Bytes::gb(1), &[]).unwrap();
        let four = sizing_for(
            Ok(&info()),
            Bytes::gb(1),
            &words("--parallel=4 -ctk q8_0 -ctv q8_0"),
        )
        .unwrap();
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
        // A long flag with `_` for `-` is the same flag, as llama.cpp reads it.
        assert_eq!(
            flag_value(&words("-c 4096 --ctx_size 0"), &["-c", "--ctx-size"]).as_deref(),
            Some("0")
        );
        assert_eq!(flag_value(&words("-c"), &["-c"]), None);
    }

    #[test]
    fn a_share_that_holds_no_layer_is_not_started_and_says_why() {
        let refused = sizing_for(Ok(&info()), Bytes(1 << 20), &[]).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "not started: not one of its layers fits its 1 MB share with a context of 512 tokens"
        );
    }

    #[test]
    fn a_recipe_s_own_context_is_judged_against_the_share_kept_where_it_fits_and_refused_with_the_figures_where_not(
    ) {
        let fits = sizing_for(Ok(&info()), Bytes::gb(1), &words("-c 2048")).unwrap();
        assert_eq!(fits.args, ["-np", "1"], "the recipe's -c stands");
        let note = fits.note.unwrap();
        assert!(
            note.starts_with("as its recipe sets it, context 2048 × 1 slot takes "),
            "{note}"
        );
        for over in [
            "--ctx-size 131072",
            "-c 0",
            "--ctx_size 0",
            "-c 262144 -np 2",
        ] {
            let refused = sizing_for(Ok(&info()), Bytes::gb(1), &words(over)).unwrap_err();
            let text = refused.to_string();
            assert!(matches!(refused, Unsized::GivenOver(_)), "{over}: {text}");
            assert!(
                text.starts_with("not started: as its recipe sets it, context ")
                    && text.ends_with(
                        "over its 1 GB share: lower its -c or -np, or give it a larger share"
                    ),
                "{over}: {text}"
            );
        }
        assert!(matches!(
            sizing_for(Ok(&info()), Bytes::gb(1), &words("-c lots")),
            Err(Unsized::NotANumber(_))
        ));
    }

    /// A hybrid (Granite 4.0 H's architecture): attention layers with a KV cache beside recurrent ones,
    /// whose state's keys (`ssm.*`) its file lacks.
    fn hybrid() -> ModelInfo {
        let g = placement::estimate::writer::Gguf::new("granitehybrid")
            .kv("granitehybrid.context_length", V::U32(1_048_576))
            .kv("granitehybrid.block_count", V::U32(2))
            .kv("granitehybrid.embedding_length", V::U32(1024))
            .kv("granitehybrid.attention.head_count", V::U32(16))
            .tensor("token_embd.weight", &[1024, 32_000], 1)
            .tensor("blk.0.ssm_in.weight", &[1024, 4096], 1)
            .tensor("blk.1.attn_q.weight", &[1024, 1024], 1);
        ModelInfo::from_header(&GgufHeader::parse(&g.header()).unwrap(), None)
    }

    #[test]
    fn a_model_whose_estimate_has_a_gap_is_started_with_a_cautious_context_and_the_console_is_told_why(
    ) {
        let sizing = sizing_for(Ok(&hybrid()), Bytes::gb(4), &[]).unwrap();
        assert_eq!(sizing.args, words("-c 4096 -np 1"));
        let note = sizing.note.unwrap();
        assert!(
            note.starts_with(
                "a cautious bound, as the estimate is incomplete (granitehybrid keeps"
            ) && note.contains("context 4096 × 1 slot takes at least "),
            "{note}"
        );
        let refused = sizing_for(Ok(&hybrid()), Bytes(10_000_000), &[]).unwrap_err();
        assert!(
            refused
                .to_string()
                .starts_with("not started: the estimate is incomplete, and even a cautious context 4096 × 1 slot takes at least "),
            "{refused}"
        );
    }

    #[test]
    fn a_model_file_that_cannot_be_read_is_started_with_a_cautious_context_not_its_own() {
        let sizing = sizing_for(Err("no file at /m.gguf"), Bytes::gb(4), &[]).unwrap();
        assert_eq!(sizing.args, words("-c 4096 -np 1"));
        assert_eq!(
            sizing.note.unwrap(),
            "-c 4096 -np 1, a cautious bound not judged against its share: no file at /m.gguf"
        );
        // The recipe's own bound stands; its -c 0 (the model's own, unknown) is refused.
        let given = sizing_for(Err("no file"), Bytes::gb(4), &words("-c 8192")).unwrap();
        assert_eq!(given.args, ["-np", "1"]);
        assert!(matches!(
            sizing_for(Err("no file"), Bytes::gb(4), &words("-c 0")),
            Err(Unsized::OwnUnjudged(_))
        ));
    }

    /// An SGLang estimate of a small model: 2 GB of weights, Llama 3.1 8B's shape.
    fn sglang_estimate() -> Estimate {
        use placement::estimate::hf::{estimate_hf, parse_config, HfTensor};
        let config = parse_config(
            br#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
            "intermediate_size": 14336, "max_position_embeddings": 131072, "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16", "vocab_size": 128256}"#,
        )
        .unwrap();
        let tensors = [HfTensor {
            name: "model.embed_tokens.weight".into(),
            dtype: "BF16".into(),
            bytes: Bytes::gb(2),
        }];
        estimate_hf(&config, &tensors, &HfSettings::default())
    }

    #[test]
    fn an_sglang_engine_s_cache_is_bounded_in_tokens_by_what_its_share_leaves_whatever_is_free_when_it_starts(
    ) {
        let e = sglang_estimate();
        let sizing = sglang_sizing(Ok(&e), Bytes::gb(12));
        assert_eq!(sizing.args[0], "--max-total-tokens");
        let tokens: u64 = sizing.args[1].parse().unwrap();
        // 128 KiB of cache a token: what 12 GB leave after the weights and buffers.
        let fixed = e.beside_cache();
        assert_eq!(tokens, (Bytes::gb(12).get() - fixed.get()) / (128 << 10));
        assert!(sizing.note.unwrap().starts_with(&format!(
            "at most {tokens} tokens of KV cache: what its 12 GB share leaves"
        )),);
        let tight = sglang_sizing(Ok(&e), Bytes::gb(2));
        assert!(tight.args.is_empty());
        assert!(
            tight.note.as_deref().unwrap().starts_with(
                "bounded by --mem-fraction-static alone, of what is free as it starts: its weights and buffers take "
            ),
            "{tight:?}"
        );
        let unread = sglang_sizing(Err("no config.json in /m"), Bytes::gb(12));
        assert!(unread.args.is_empty());
        assert_eq!(
            unread.note.unwrap(),
            "bounded by --mem-fraction-static alone, of what is free as it starts: no config.json in /m"
        );
    }
}
