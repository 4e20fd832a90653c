//! A model's file on this machine, read for its memory estimate: the GGUF header alone, never the weights.
//! In the runtime because it reads where engines run (a file on a Ray node would be read by a job there),
//! kept apart from the processes so that the fleet can ask for an estimate without starting anything.

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
    /// A Hugging Face model folder or a model's name on the Hub: vLLM's and SGLang's.
    #[error(
        "{0} is a Hugging Face model (a folder or a name), not a GGUF file: safetensors folders are not estimated yet"
    )]
    Safetensors(String),
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
    tokio::task::spawn_blocking(move || read_info(Path::new(&path)))
        .await
        .unwrap_or_else(|e| {
            Err(NoEstimate::Unreadable {
                path: PathBuf::new(),
                error: format!("the reading task failed: {e}"),
            })
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
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(if looks_like_hub_name(path) {
                NoEstimate::Safetensors(path.display().to_string())
            } else {
                NoEstimate::NoFile(path.to_owned())
            });
        }
        Err(e) => return Err(unreadable(e)),
    };
    if meta.is_dir() {
        return Err(NoEstimate::Safetensors(path.display().to_string()));
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
    fn a_hub_name_is_a_safetensors_model() {
        let err = estimate_file(Path::new("zai-org/GLM-4.5"), &Settings::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("safetensors folders are not estimated yet"),
            "{err}"
        );
    }

    #[test]
    fn a_folder_is_a_safetensors_model() {
        let dir = tempfile::tempdir().unwrap();
        let err = estimate_file(dir.path(), &Settings::default()).unwrap_err();
        assert!(matches!(err, NoEstimate::Safetensors(_)), "{err:?}");
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
