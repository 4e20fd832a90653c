//! A model's files, read for its memory estimate: a GGUF file's header, or a Hugging Face folder's
//! `config.json` and each safetensors file's header, never the weights. In the runtime because files are read
//! where engines run: on this machine by [`ThisMachine`], on a Ray node by a short job there
//! (`ray::files`). Both answer the same two questions ([`Files`]); what the answers mean is decided here,
//! once.

use async_trait::async_trait;
use placement::estimate::hf::{
    estimate_hf, parse_config, parse_safetensors, HfError, HfSettings, HfTensor,
};
use placement::estimate::{estimate, Estimate, GgufError, GgufHeader, ModelInfo, Settings};
use placement::Bytes;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The first read: most headers fit, tokenizer vocabularies included.
const FIRST_READ: u64 = 1 << 20;

/// The most of a file read for its header: past this it is a damaged file, not a header.
pub const MAX_HEADER: u64 = 64 << 20;

/// The most of `config.json` read: a config is a few KB.
pub const MAX_CONFIG: u64 = 4 << 20;

/// Why a model gets no estimate. Each says what a person would check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoEstimate {
    /// The path names nothing where it was read.
    #[error("{path} does not exist on {place}")]
    NoFile {
        /// The path.
        path: String,
        /// Where it was looked for: this machine, or a Ray node.
        place: String,
    },
    /// A folder or a Hub name where llama.cpp takes a GGUF file.
    #[error("{0} is a Hugging Face model (a folder or a name), not the GGUF file llama.cpp loads")]
    NotAFile(String),
    /// A model's name on the Hugging Face Hub, which vLLM and SGLang download themselves.
    #[error(
        "{0} is a model's name on the Hugging Face Hub, which the engine downloads itself; Tessera reads files it can see, so give the model a downloaded folder as its model_path for an estimate"
    )]
    HubName(String),
    /// A path that is not a Hugging Face model folder.
    #[error("{path} is not a model folder Tessera can read: {why}")]
    NotAFolder {
        /// The path.
        path: String,
        /// What is wrong with it.
        why: String,
    },
    /// A path that is not a GGUF file.
    #[error("{path} is not a GGUF file Tessera can read: {error}")]
    NotGguf {
        /// The path.
        path: String,
        /// What the header reader found.
        error: GgufError,
    },
    /// A header longer than [`MAX_HEADER`].
    #[error("{0}'s GGUF header runs past {max} MiB; it is not read further", max = MAX_HEADER >> 20)]
    HeaderTooLong(String),
    /// The file could not be read.
    #[error("{path} could not be read: {error}")]
    Unreadable {
        /// The path.
        path: String,
        /// The operating system's words, or the reading job's.
        error: String,
    },
    /// An engine whose memory the estimate does not model.
    #[error("{0}")]
    Engine(String),
}

/// The first bytes of a file, and its length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefix {
    /// The file's length.
    pub len: u64,
    /// Its first bytes: as many as were asked for, fewer where the file is shorter.
    pub bytes: Vec<u8>,
}

/// A model folder's headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolderHeaders {
    /// Its `config.json` (at most [`MAX_CONFIG`]), where it has one.
    pub config: Option<Vec<u8>>,
    /// Each `.safetensors` file by name, in name order, with its header: the 8-byte length, then the header
    /// where that is at most [`MAX_HEADER`].
    pub shards: Vec<(String, Vec<u8>)>,
}

/// What a reader found in place of what it was asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// Nothing is at the path.
    Missing,
    /// A folder, where a file was asked for.
    Folder,
    /// A file, where a folder was asked for.
    File,
    /// Something could not be read.
    Unreadable {
        /// What.
        path: String,
        /// Why.
        error: String,
    },
}

/// Where a model's files are read.
#[async_trait]
pub trait Files: Send + Sync {
    /// Where that is, in words: "this machine", "the Ray node gpu-7".
    fn place(&self) -> String;
    /// The first `want` bytes of the file at `path`, and its length.
    async fn prefix(&self, path: &str, want: u64) -> Result<Prefix, Miss>;
    /// The headers of the model folder at `path`.
    async fn folder(&self, path: &str) -> Result<FolderHeaders, Miss>;
}

/// Estimates the GGUF model at `path`, read by `files`, under `settings`.
pub async fn estimate_gguf(
    files: &dyn Files,
    path: &str,
    settings: &Settings,
) -> Result<Estimate, NoEstimate> {
    gguf_info(files, path)
        .await
        .map(|info| estimate(&info, settings))
}

/// What the header of the GGUF model at `path`, read by `files`, says memory depends on: read from the
/// first [`FIRST_READ`] bytes, and again further, up to [`MAX_HEADER`], while the header runs on.
pub async fn gguf_info(files: &dyn Files, path: &str) -> Result<ModelInfo, NoEstimate> {
    let not_gguf = |error| NoEstimate::NotGguf {
        path: path.to_owned(),
        error,
    };
    let mut want = FIRST_READ;
    loop {
        let read = files
            .prefix(path, want)
            .await
            .map_err(|miss| missed(files, path, miss, NoEstimate::NotAFile))?;
        let have = read.bytes.len() as u64;
        match GgufHeader::parse(&read.bytes) {
            Ok(header) => return Ok(ModelInfo::from_header(&header, Some(Bytes(read.len)))),
            Err(GgufError::Truncated { needed }) => {
                if have >= read.len || needed > read.len {
                    return Err(not_gguf(GgufError::Truncated { needed }));
                }
                if have >= MAX_HEADER || needed > MAX_HEADER {
                    return Err(NoEstimate::HeaderTooLong(path.to_owned()));
                }
                want = needed.max(have * 2).min(MAX_HEADER).min(read.len);
            }
            Err(error) => return Err(not_gguf(error)),
        }
    }
}

/// Estimates the Hugging Face model folder at `path`, read by `files`, under vLLM or SGLang: from its
/// `config.json` and each safetensors file's header.
pub async fn estimate_folder(
    files: &dyn Files,
    path: &str,
    settings: &HfSettings,
) -> Result<Estimate, NoEstimate> {
    let not_folder = |at: &str, why: String| NoEstimate::NotAFolder {
        path: at.to_owned(),
        why,
    };
    let headers = files.folder(path).await.map_err(|miss| match miss {
        Miss::File => not_folder(
            path,
            "it is a file; vLLM and SGLang are estimated from a folder with config.json and .safetensors files".into(),
        ),
        miss => missed(files, path, miss, NoEstimate::HubName),
    })?;
    let config = headers
        .config
        .ok_or_else(|| not_folder(path, "it has no config.json".into()))?;
    let config = parse_config(&config).map_err(|e| not_folder(path, e.to_string()))?;
    if headers.shards.is_empty() {
        return Err(not_folder(path, "it has no .safetensors files".into()));
    }
    let mut tensors: Vec<HfTensor> = Vec::new();
    for (name, header) in &headers.shards {
        let shard = format!("{}/{name}", path.trim_end_matches('/'));
        match parse_safetensors(header) {
            Ok(read) => tensors.extend(read),
            Err(HfError::Truncated { needed }) if needed > MAX_HEADER => {
                return Err(not_folder(
                    &shard,
                    format!("its header runs past {} MiB", MAX_HEADER >> 20),
                ))
            }
            Err(HfError::Truncated { .. }) => {
                return Err(not_folder(&shard, "its header is cut short".into()))
            }
            Err(e) => return Err(not_folder(&shard, e.to_string())),
        }
    }
    Ok(estimate_hf(&config, &tensors, settings))
}

/// What a reader's miss means for a model at `path`, where `hub` says what a Hub name is to the engine
/// asking. A folder is no GGUF file; a file is no folder.
fn missed(files: &dyn Files, path: &str, miss: Miss, hub: fn(String) -> NoEstimate) -> NoEstimate {
    match miss {
        Miss::Missing if looks_like_hub_name(path) => hub(path.to_owned()),
        Miss::Missing => NoEstimate::NoFile {
            path: path.to_owned(),
            place: files.place(),
        },
        Miss::Folder => NoEstimate::NotAFile(path.to_owned()),
        Miss::File => NoEstimate::NotAFolder {
            path: path.to_owned(),
            why: "it is a file".into(),
        },
        Miss::Unreadable { path, error } => NoEstimate::Unreadable { path, error },
    }
}

/// `org/name` with no such file: a model's name on the Hugging Face Hub, which the engines download.
fn looks_like_hub_name(path: &str) -> bool {
    !path.starts_with('/')
        && !path.starts_with('.')
        && path.split('/').count() == 2
        && !path.ends_with(".gguf")
}

/// This machine's files, read off the async executor.
pub struct ThisMachine;

#[async_trait]
impl Files for ThisMachine {
    fn place(&self) -> String {
        "this machine".to_owned()
    }

    async fn prefix(&self, path: &str, want: u64) -> Result<Prefix, Miss> {
        let path = path.to_owned();
        off_executor(move || read_prefix(Path::new(&path), want)).await
    }

    async fn folder(&self, path: &str) -> Result<FolderHeaders, Miss> {
        let path = path.to_owned();
        off_executor(move || read_folder(Path::new(&path))).await
    }
}

/// Runs a blocking read off the async executor.
async fn off_executor<T: Send + 'static>(
    read: impl FnOnce() -> Result<T, Miss> + Send + 'static,
) -> Result<T, Miss> {
    tokio::task::spawn_blocking(read).await.unwrap_or_else(|e| {
        Err(Miss::Unreadable {
            path: String::new(),
            error: format!("the reading task failed: {e}"),
        })
    })
}

fn unreadable(at: &Path) -> impl Fn(io::Error) -> Miss + '_ {
    move |e| Miss::Unreadable {
        path: at.display().to_string(),
        error: e.to_string(),
    }
}

/// Whether `path` is a folder; [`Miss::Missing`] where nothing is there.
fn is_dir(path: &Path) -> Result<bool, Miss> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.is_dir()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(Miss::Missing),
        Err(e) => Err(unreadable(path)(e)),
    }
}

/// The blocking part of [`ThisMachine::prefix`].
fn read_prefix(path: &Path, want: u64) -> Result<Prefix, Miss> {
    if is_dir(path)? {
        return Err(Miss::Folder);
    }
    let file = File::open(path).map_err(unreadable(path))?;
    let len = file.metadata().map_err(unreadable(path))?.len();
    let mut bytes = Vec::new();
    file.take(want)
        .read_to_end(&mut bytes)
        .map_err(unreadable(path))?;
    Ok(Prefix { len, bytes })
}

/// The blocking part of [`ThisMachine::folder`].
fn read_folder(path: &Path) -> Result<FolderHeaders, Miss> {
    if !is_dir(path)? {
        return Err(Miss::File);
    }
    let config_path = path.join("config.json");
    let mut config = Vec::new();
    let config = match File::open(&config_path) {
        Ok(file) => {
            file.take(MAX_CONFIG)
                .read_to_end(&mut config)
                .map_err(unreadable(&config_path))?;
            Some(config)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(unreadable(&config_path)(e)),
    };
    let mut names: Vec<String> = std::fs::read_dir(path)
        .map_err(unreadable(path))?
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".safetensors"))
        .collect();
    names.sort();
    let shards = names
        .into_iter()
        .map(|name| {
            let at = path.join(&name);
            let mut file = File::open(&at).map_err(unreadable(&at))?;
            let mut header = Vec::new();
            (&mut file)
                .take(8)
                .read_to_end(&mut header)
                .map_err(unreadable(&at))?;
            if let Ok(len) = <[u8; 8]>::try_from(header.as_slice()).map(u64::from_le_bytes) {
                if len <= MAX_HEADER {
                    file.take(len)
                        .read_to_end(&mut header)
                        .map_err(unreadable(&at))?;
                }
            }
            Ok((name, header))
        })
        .collect::<Result<_, Miss>>()?;
    Ok(FolderHeaders { config, shards })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn estimate_file(path: &Path, settings: &Settings) -> Result<Estimate, NoEstimate> {
        estimate_gguf(&ThisMachine, &path.display().to_string(), settings).await
    }

    async fn estimate_here(path: &Path, settings: &HfSettings) -> Result<Estimate, NoEstimate> {
        estimate_folder(&ThisMachine, &path.display().to_string(), settings).await
    }

    #[tokio::test]
    async fn a_header_past_the_first_read_is_read_to_its_end_and_no_further() {
        use placement::estimate::writer::{llama, V};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        // A vocabulary of 300,000 tokens makes a header of about 4 MiB.
        let gguf = llama(1, 64, 128, 4, 4, 300, 0).kv("tokenizer.ggml.tokens", V::Strs(300_000));
        let mut bytes = gguf.header();
        assert!(bytes.len() as u64 > 2 * FIRST_READ);
        bytes.resize(bytes.len() + (8 << 20), 0);
        std::fs::write(&path, bytes).unwrap();
        let estimate = estimate_file(&path, &Settings::default()).await.unwrap();
        assert_eq!(estimate.weights.bytes, Bytes(gguf.table_bytes()));
    }

    #[tokio::test]
    async fn a_missing_file_says_so() {
        let err = estimate_file(Path::new("/nonexistent/m.gguf"), &Settings::default()).await;
        assert!(matches!(err, Err(NoEstimate::NoFile { .. })), "{err:?}");
    }

    #[tokio::test]
    async fn a_hub_name_is_no_gguf_file_for_llama_cpp() {
        let err = estimate_file(Path::new("zai-org/GLM-4.5"), &Settings::default())
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("not the GGUF file llama.cpp loads"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_folder_is_no_gguf_file_for_llama_cpp() {
        let dir = tempfile::tempdir().unwrap();
        let err = estimate_file(dir.path(), &Settings::default())
            .await
            .unwrap_err();
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

    #[tokio::test]
    async fn a_model_folder_is_estimated_from_its_config_and_the_headers_of_its_shards() {
        let dir = tempfile::tempdir().unwrap();
        hf_folder(dir.path());
        let e = estimate_here(dir.path(), &HfSettings::default())
            .await
            .unwrap();
        assert_eq!(e.weights.bytes, Bytes(2 * 54_784));
        assert_eq!(e.weights.per_layer, [Bytes(16_384), Bytes(38_400)]);
        // 2 × 2 heads × 16 × 2 bytes × 2 layers = 256 bytes a token, for its own 2,048 tokens.
        assert_eq!(e.kv_cache.unwrap().bytes, Bytes(256 * 2048));
        assert_eq!(
            (e.assumed.context, e.assumed.context_from_model),
            (2048, true)
        );
    }

    #[tokio::test]
    async fn a_folder_without_config_or_shards_and_a_hub_name_say_what_to_give_instead() {
        let dir = tempfile::tempdir().unwrap();
        let err = estimate_here(dir.path(), &HfSettings::default())
            .await
            .unwrap_err();
        assert!(err.to_string().ends_with("it has no config.json"), "{err}");
        hf_folder(dir.path());
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "safetensors") {
                std::fs::remove_file(path).unwrap();
            }
        }
        let err = estimate_here(dir.path(), &HfSettings::default())
            .await
            .unwrap_err();
        assert!(
            err.to_string().ends_with("it has no .safetensors files"),
            "{err}"
        );
        let err = estimate_here(Path::new("Qwen/Qwen3-0.6B"), &HfSettings::default())
            .await
            .unwrap_err();
        assert!(matches!(err, NoEstimate::HubName(_)), "{err:?}");
        assert!(err
            .to_string()
            .contains("give the model a downloaded folder as its model_path"));
    }

    #[tokio::test]
    async fn a_file_that_is_not_gguf_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, b"not a model at all").unwrap();
        let err = estimate_file(&path, &Settings::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a GGUF file"), "{err}");
    }

    #[tokio::test]
    async fn a_header_cut_short_by_the_end_of_the_file_is_not_gguf() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let mut bytes = b"GGUF".to_vec();
        bytes.extend(3u32.to_le_bytes());
        bytes.extend(1u64.to_le_bytes());
        std::fs::write(&path, bytes).unwrap();
        let err = estimate_file(&path, &Settings::default())
            .await
            .unwrap_err();
        assert!(matches!(err, NoEstimate::NotGguf { .. }), "{err:?}");
    }
}
