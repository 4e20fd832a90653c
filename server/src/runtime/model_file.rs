//! A model's file on this machine, read for its memory estimate: the GGUF header alone, never the weights.
//! In the runtime because it reads where engines run (a file on a Ray node would be read by a job there),
//! kept apart from the processes so that the fleet can ask for an estimate without starting anything.

use placement::estimate::hf::{
    estimate_hf, parse_config, parse_safetensors, HfError, HfSettings, HfTensor,
};
use placement::estimate::{estimate, Estimate, GgufError, GgufHeader, ModelInfo, Settings};
use placement::Bytes;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The first read: most headers fit, tokenizer vocabularies included.
const FIRST_READ: u64 = 1 << 20;

/// The most of a file read for its header: past this it is a damaged file, not a header.
pub const MAX_HEADER: u64 = 64 << 20;

/// Why a model gets no estimate. Each says what a person would check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoEstimate {
    /// The path names nothing on this machine.
    #[error("{0} does not exist on this machine")]
    NoFile(PathBuf),
    /// A folder or a Hub name where llama.cpp takes a GGUF file.
    #[error("{0} is a Hugging Face model (a folder or a name), not the GGUF file llama.cpp loads")]
    NotAFile(String),
    /// A model's name on the Hugging Face Hub, which vLLM and SGLang download themselves.
    #[error(
        "{0} is a model's name on the Hugging Face Hub, which the engine downloads itself; the server reads files on this machine only, so give the model a downloaded folder as its model_path for an estimate"
    )]
    HubName(String),
    /// A path that is not a Hugging Face model folder.
    #[error("{path} is not a model folder Tessera can read: {why}")]
    NotAFolder {
        /// The path.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A path that is not a GGUF file.
    #[error("{path} is not a GGUF file Tessera can read: {error}")]
    NotGguf {
        /// The path.
        path: PathBuf,
        /// What the header reader found.
        error: GgufError,
    },
    /// A header longer than [`MAX_HEADER`].
    #[error("{0}'s GGUF header runs past {max} MiB; it is not read further", max = MAX_HEADER >> 20)]
    HeaderTooLong(PathBuf),
    /// The file could not be read.
    #[error("{path} could not be read: {error}")]
    Unreadable {
        /// The path.
        path: PathBuf,
        /// The operating system's words.
        error: String,
    },
    /// The model runs on a node of the Ray cluster, whose files this server cannot see.
    #[error("{path} is on the Ray node {machine}, and the server reads model files on this machine only")]
    OnNode {
        /// The path.
        path: String,
        /// The node's machine.
        machine: String,
    },
    /// An engine whose memory the estimate does not model.
    #[error("{0}")]
    Engine(String),
}

/// Estimates a GGUF model at `path` on this machine under `settings`, reading its header only, off the
/// async executor.
pub async fn estimate_local(path: String, settings: Settings) -> Result<Estimate, NoEstimate> {
    info_local(path)
        .await
        .map(|info| estimate(&info, &settings))
}

/// What the header of a GGUF model at `path` on this machine says memory depends on, read off the async
/// executor.
pub async fn info_local(path: String) -> Result<ModelInfo, NoEstimate> {
    off_executor(move || read_info(Path::new(&path))).await
}

/// Runs a blocking read of model files off the async executor.
async fn off_executor<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, NoEstimate> + Send + 'static,
) -> Result<T, NoEstimate> {
    tokio::task::spawn_blocking(read).await.unwrap_or_else(|e| {
        Err(NoEstimate::Unreadable {
            path: PathBuf::new(),
            error: format!("the reading task failed: {e}"),
        })
    })
}

/// The metadata of `path`; where it names nothing, `hub` says what a Hub name is to the engine asking, or
/// that nothing is there.
fn metadata(path: &Path, hub: fn(String) -> NoEstimate) -> Result<std::fs::Metadata, NoEstimate> {
    std::fs::metadata(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound if looks_like_hub_name(path) => hub(path.display().to_string()),
        io::ErrorKind::NotFound => NoEstimate::NoFile(path.to_owned()),
        _ => NoEstimate::Unreadable {
            path: path.to_owned(),
            error: e.to_string(),
        },
    })
}

/// [`estimate_local`], blocking.
#[cfg(test)]
fn estimate_file(path: &Path, settings: &Settings) -> Result<Estimate, NoEstimate> {
    read_info(path).map(|info| estimate(&info, settings))
}

/// The blocking part of [`info_local`]: the header read in growing steps until it is whole.
fn read_info(path: &Path) -> Result<ModelInfo, NoEstimate> {
    let unreadable = |error: io::Error| NoEstimate::Unreadable {
        path: path.to_owned(),
        error: error.to_string(),
    };
    let meta = metadata(path, NoEstimate::NotAFile)?;
    if meta.is_dir() {
        return Err(NoEstimate::NotAFile(path.display().to_string()));
    }
    let file_len = meta.len();
    let mut file = File::open(path).map_err(unreadable)?;
    let mut prefix = Vec::new();
    let mut want = FIRST_READ.min(file_len);
    loop {
        let have = prefix.len() as u64;
        if want > have {
            (&mut file)
                .take(want - have)
                .read_to_end(&mut prefix)
                .map_err(unreadable)?;
        }
        match GgufHeader::parse(&prefix) {
            Ok(header) => return Ok(ModelInfo::from_header(&header, Some(Bytes(file_len)))),
            Err(GgufError::Truncated { needed }) => {
                let have = prefix.len() as u64;
                if have >= file_len || needed > file_len {
                    return Err(NoEstimate::NotGguf {
                        path: path.to_owned(),
                        error: GgufError::Truncated { needed },
                    });
                }
                if have >= MAX_HEADER || needed > MAX_HEADER {
                    return Err(NoEstimate::HeaderTooLong(path.to_owned()));
                }
                want = needed.max(have * 2).min(MAX_HEADER).min(file_len);
            }
            Err(error) => {
                return Err(NoEstimate::NotGguf {
                    path: path.to_owned(),
                    error,
                })
            }
        }
    }
}

/// Estimates a Hugging Face model folder at `path` on this machine under vLLM or SGLang, reading its
/// `config.json` and each safetensors file's header only, off the async executor.
pub async fn estimate_folder_local(
    path: String,
    settings: HfSettings,
) -> Result<Estimate, NoEstimate> {
    off_executor(move || estimate_folder(Path::new(&path), &settings)).await
}

/// The most of `config.json` read: a config is a few KB.
const MAX_CONFIG: u64 = 4 << 20;

/// The blocking part of [`estimate_folder_local`].
fn estimate_folder(path: &Path, settings: &HfSettings) -> Result<Estimate, NoEstimate> {
    let unreadable = |at: &Path, error: io::Error| NoEstimate::Unreadable {
        path: at.to_owned(),
        error: error.to_string(),
    };
    let not_folder = |why: String| NoEstimate::NotAFolder {
        path: path.to_owned(),
        why,
    };
    if !metadata(path, NoEstimate::HubName)?.is_dir() {
        return Err(not_folder(
            "it is a file; vLLM and SGLang are estimated from a folder with config.json and .safetensors files".into(),
        ));
    }
    let config_path = path.join("config.json");
    let mut config = Vec::new();
    File::open(&config_path)
        .and_then(|f| f.take(MAX_CONFIG).read_to_end(&mut config))
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => not_folder("it has no config.json".into()),
            _ => unreadable(&config_path, e),
        })?;
    let config = parse_config(&config).map_err(|e| not_folder(e.to_string()))?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|e| unreadable(path, e))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(not_folder("it has no .safetensors files".into()));
    }
    let mut tensors = Vec::new();
    for file in &files {
        tensors.extend(safetensors_header(file)?);
    }
    Ok(estimate_hf(&config, &tensors, settings))
}

/// The tensors of one safetensors file, from its header alone.
fn safetensors_header(path: &Path) -> Result<Vec<HfTensor>, NoEstimate> {
    let unreadable = |error: io::Error| NoEstimate::Unreadable {
        path: path.to_owned(),
        error: error.to_string(),
    };
    let not_folder = |why: String| NoEstimate::NotAFolder {
        path: path.to_owned(),
        why,
    };
    let mut file = File::open(path).map_err(unreadable)?;
    let mut prefix = Vec::new();
    (&mut file)
        .take(8)
        .read_to_end(&mut prefix)
        .map_err(unreadable)?;
    loop {
        match parse_safetensors(&prefix) {
            Ok(tensors) => return Ok(tensors),
            Err(HfError::Truncated { needed }) if needed > MAX_HEADER => {
                return Err(not_folder(format!(
                    "its header runs past {} MiB",
                    MAX_HEADER >> 20
                )))
            }
            Err(HfError::Truncated { needed }) => {
                let have = prefix.len() as u64;
                let read = (&mut file)
                    .take(needed - have)
                    .read_to_end(&mut prefix)
                    .map_err(unreadable)?;
                if read == 0 {
                    return Err(not_folder("its header is cut short".into()));
                }
            }
            Err(e) => return Err(not_folder(e.to_string())),
        }
    }
}

/// `org/name` with no such file: a model's name on the Hugging Face Hub, which vLLM downloads.
fn looks_like_hub_name(path: &Path) -> bool {
    let text = path.to_string_lossy();
    !text.starts_with('/')
        && !text.starts_with('.')
        && text.split('/').count() == 2
        && !text.ends_with(".gguf")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_past_the_first_read_is_read_to_its_end_and_no_further() {
        use placement::estimate::writer::{llama, V};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        // A vocabulary of 300,000 tokens makes a header of about 4 MiB.
        let gguf = llama(1, 64, 128, 4, 4, 300, 0).kv("tokenizer.ggml.tokens", V::Strs(300_000));
        let mut bytes = gguf.header();
        assert!(bytes.len() as u64 > 2 * FIRST_READ);
        bytes.resize(bytes.len() + (8 << 20), 0);
        std::fs::write(&path, bytes).unwrap();
        let estimate = estimate_file(&path, &Settings::default()).unwrap();
        assert_eq!(estimate.weights.bytes, Bytes(gguf.table_bytes()));
    }

    #[test]
    fn a_missing_file_says_so() {
        let err = estimate_file(Path::new("/nonexistent/m.gguf"), &Settings::default());
        assert!(matches!(err, Err(NoEstimate::NoFile(_))), "{err:?}");
    }

    #[test]
    fn a_hub_name_is_no_gguf_file_for_llama_cpp() {
        let err = estimate_file(Path::new("zai-org/GLM-4.5"), &Settings::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("not the GGUF file llama.cpp loads"),
            "{err}"
        );
    }

    #[test]
    fn a_folder_is_no_gguf_file_for_llama_cpp() {
        let dir = tempfile::tempdir().unwrap();
        let err = estimate_file(dir.path(), &Settings::default()).unwrap_err();
        assert!(matches!(err, NoEstimate::NotAFile(_)), "{err:?}");
    }

    /// A folder as the Hub lays one out: config.json beside two safetensors shards.
    fn hf_folder(dir: &Path) {
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
                "max_position_embeddings": 2048, "vocab_size": 300, "torch_dtype": "bfloat16"}"#,
        )
        .unwrap();
        for (shard, names) in [
            (
                "model-00001-of-00002.safetensors",
                [
                    "model.embed_tokens.weight",
                    "model.layers.0.mlp.up_proj.weight",
                ],
            ),
            (
                "model-00002-of-00002.safetensors",
                ["model.layers.1.mlp.up_proj.weight", "lm_head.weight"],
            ),
        ] {
            let header = serde_json::json!({
                names[0]: {"dtype": "BF16", "shape": [300, 64], "data_offsets": [0, 38_400]},
                names[1]: {"dtype": "BF16", "shape": [64, 128], "data_offsets": [38_400, 54_784]},
            });
            let json = serde_json::to_vec(&header).unwrap();
            let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
            bytes.extend(json);
            // The weights themselves, never read.
            bytes.resize(bytes.len() + 54_784, 0xAB);
            std::fs::write(dir.join(shard), bytes).unwrap();
        }
    }

    #[test]
    fn a_model_folder_is_estimated_from_its_config_and_the_headers_of_its_shards() {
        let dir = tempfile::tempdir().unwrap();
        hf_folder(dir.path());
        let e = estimate_folder(dir.path(), &HfSettings::default()).unwrap();
        assert_eq!(e.weights.bytes, Bytes(2 * 54_784));
        assert_eq!(e.weights.per_layer, [Bytes(16_384), Bytes(38_400)]);
        // 2 × 2 heads × 16 × 2 bytes × 2 layers = 256 bytes a token, for its own 2,048 tokens.
        assert_eq!(e.kv_cache.unwrap().bytes, Bytes(256 * 2048));
        assert_eq!(
            (e.assumed.context, e.assumed.context_from_model),
            (2048, true)
        );
    }

    #[test]
    fn a_folder_without_config_or_shards_and_a_hub_name_say_what_to_give_instead() {
        let dir = tempfile::tempdir().unwrap();
        let err = estimate_folder(dir.path(), &HfSettings::default()).unwrap_err();
        assert!(err.to_string().ends_with("it has no config.json"), "{err}");
        hf_folder(dir.path());
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                std::fs::remove_file(path).unwrap();
            }
        }
        let err = estimate_folder(dir.path(), &HfSettings::default()).unwrap_err();
        assert!(
            err.to_string().ends_with("it has no .safetensors files"),
            "{err}"
        );
        let err =
            estimate_folder(Path::new("Qwen/Qwen3-0.6B"), &HfSettings::default()).unwrap_err();
        assert!(matches!(err, NoEstimate::HubName(_)), "{err:?}");
        assert!(err
            .to_string()
            .contains("give the model a downloaded folder as its model_path"));
    }

    #[test]
    fn a_file_that_is_not_gguf_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, b"not a model at all").unwrap();
        let err = estimate_file(&path, &Settings::default()).unwrap_err();
        assert!(err.to_string().contains("not a GGUF file"), "{err}");
    }

    #[test]
    fn a_header_cut_short_by_the_end_of_the_file_is_not_gguf() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let err = estimate_file(&path, &Settings::default()).unwrap_err();
        assert!(matches!(err, NoEstimate::NotGguf { .. }), "{err:?}");
    }
}
